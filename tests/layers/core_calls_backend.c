/* A core object that calls a backend: check_layers.sh must reject it
   (test_layers_mutant_core). Compiled, never linked. */
#include "cpu/cpu.h"

sbnResult_t sbn_layers_mutant_core(const sbn_op_t* op);
sbnResult_t sbn_layers_mutant_core(const sbn_op_t* op) { return sbn_cpu_forward(op); }
