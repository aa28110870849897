/* check_excerpts.c — the README's code excerpts must be the code they quote.
 *
 * Usage: check_excerpts MARKDOWN ROOT
 * A line `<!-- excerpt: PATH -->` in MARKDOWN marks the fenced code block that follows as
 * an excerpt of ROOT/PATH. Lines `/ * ... * /` (without the spaces) in the block elide
 * code: the parts between them must each appear in the file as consecutive lines, in
 * order, each line equal to the excerpt's line after an indentation common to the part
 * (code quoted from inside a function loses its indentation). Exit 0 when every excerpt
 * matches; 1 when one does not (naming its first line not found), when a marker has no
 * block, or when MARKDOWN has no marker at all (a check of nothing would pass).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  char** line;
  int n;
} lines_t;

/* Reads a whole text file as lines without their '\n'; exits on error. */
static lines_t read_lines(const char* path) {
  lines_t L = {NULL, 0};
  FILE* f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "check_excerpts: cannot open %s\n", path);
    exit(1);
  }
  char* buf = NULL;
  size_t cap = 0;
  ssize_t len;
  int cap_lines = 0;
  while ((len = getline(&buf, &cap, f)) >= 0) {
    if (len > 0 && buf[len - 1] == '\n') buf[len - 1] = '\0';
    if (L.n == cap_lines) {
      cap_lines = cap_lines ? 2 * cap_lines : 256;
      L.line = realloc(L.line, (size_t)cap_lines * sizeof *L.line);
      if (!L.line) exit(1);
    }
    L.line[L.n++] = strdup(buf);
  }
  free(buf);
  fclose(f);
  return L;
}

static void free_lines(lines_t* L) {
  for (int k = 0; k < L->n; k++) free(L->line[k]);
  free(L->line);
}

static int is_blank(const char* s) {
  return s[strspn(s, " \t")] == '\0';
}
static int is_elision(const char* s) {
  s += strspn(s, " \t");
  return strcmp(s, "/* ... */") == 0;
}

/* Whether part[0..n) appears in file F at line `at`, all lines shifted by one indent. */
static int part_at(const lines_t* F, int at, char** part, int n) {
  if (at + n > F->n) return 0;
  const char* first = F->line[at];
  size_t flen = strlen(first), plen = strlen(part[0]);
  if (flen < plen || strcmp(first + flen - plen, part[0]) != 0) return 0;
  const size_t indent = flen - plen;
  if (strspn(first, " \t") < indent) return 0; /* the indent is whitespace only */
  for (int k = 1; k < n; k++) {
    const char* fl = F->line[at + k];
    if (is_blank(part[k])) {
      if (!is_blank(fl)) return 0;
    } else if (strlen(fl) < indent || strncmp(fl, first, indent) != 0 ||
               strcmp(fl + indent, part[k]) != 0) {
      return 0;
    }
  }
  return 1;
}

/* Checks one excerpt (block lines b[0..nb)) against ROOT/path; prints what is wrong. */
static int check_block(const char* root, const char* path, char** b, int nb, int md_line) {
  char full[4096];
  snprintf(full, sizeof full, "%s/%s", root, path);
  lines_t F = read_lines(full);
  int from = 0, ok = 1;
  for (int i = 0; i < nb && ok;) {
    if (is_elision(b[i])) {
      i++;
      continue;
    }
    if (is_blank(b[i])) { /* a part's blank lines next to an elision are not code */
      i++;
      continue;
    }
    int n = 0;
    while (i + n < nb && !is_elision(b[i + n])) n++;
    while (n > 0 && is_blank(b[i + n - 1])) n--;
    int at = from;
    while (at < F.n && !part_at(&F, at, &b[i], n)) at++;
    if (at >= F.n) {
      fprintf(stderr,
              "check_excerpts: the excerpt at line %d does not match %s: its part from '%s' "
              "is not in the file (searched from line %d)\n",
              md_line, path, b[i], from + 1);
      ok = 0;
    }
    from = at + n;
    while (i < nb && !is_elision(b[i])) i++;
  }
  free_lines(&F);
  return ok;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: check_excerpts MARKDOWN ROOT\n");
    return 2;
  }
  lines_t M = read_lines(argv[1]);
  int excerpts = 0, bad = 0;
  static const char kMark[] = "<!-- excerpt: ";
  for (int i = 0; i < M.n; i++) {
    if (strncmp(M.line[i], kMark, sizeof kMark - 1) != 0) continue;
    char path[1024];
    if (sscanf(M.line[i] + sizeof kMark - 1, "%1023s", path) != 1) path[0] = '\0';
    int open = i + 1;
    while (open < M.n && is_blank(M.line[open])) open++;
    int close = open + 1;
    while (close < M.n && strncmp(M.line[close], "```", 3) != 0) close++;
    if (!path[0] || open >= M.n || strncmp(M.line[open], "```", 3) != 0 || close >= M.n) {
      fprintf(stderr, "check_excerpts: line %d: a marker without a path or code block\n", i + 1);
      bad++;
      continue;
    }
    excerpts++;
    if (!check_block(argv[2], path, &M.line[open + 1], close - open - 1, open + 2)) bad++;
    i = close;
  }
  if (excerpts == 0 && bad == 0) {
    fprintf(stderr, "check_excerpts: no '%s...' marker in %s\n", kMark, argv[1]);
    bad++;
  }
  printf("check_excerpts: %d excerpt(s) in %s, %d wrong\n", excerpts, argv[1], bad);
  free_lines(&M);
  return bad ? 1 : 0;
}
