/* A backend object (its path says cpu/) that calls the front: check_layers.sh must reject
   it (test_layers_mutant_backend). Compiled, never linked. */
#include "front.h"

int sbn_layers_mutant_backend(void);
int sbn_layers_mutant_backend(void) { return sbn_group_active(); }
