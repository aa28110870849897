/* mp_launch.c — see mp_launch.h. Plain C11 + POSIX (prctl on Linux only); no CUDA. */
#define _POSIX_C_SOURCE 200809L
#include "mp_launch.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

double mp_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
  struct timespec ts;
  ts.tv_sec = (time_t)s;
  ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* The launcher's own messages: straight to stderr (unbuffered), one fprintf each. */
static void say(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s\n", buf);
}

static int write_all(int fd, const void* p, size_t n) {
  const char* c = (const char*)p;
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Reads exactly n bytes (blocking); returns the number read (< n at EOF or on error). */
static size_t read_all(int fd, void* p, size_t n) {
  char* c = (char*)p;
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, c + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  return got;
}

static void close_fd(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

static int make_pipe(int p[2]) {
  if (pipe(p) != 0) {
    p[0] = p[1] = -1;
    return -1;
  }
  fcntl(p[0], F_SETFD, FD_CLOEXEC);
  fcntl(p[1], F_SETFD, FD_CLOEXEC);
  return 0;
}

/* A child's return value as an exit status. */
static int exit_code(int rank, int rc) {
  if (rc >= 0 && rc <= 255) return rc;
  fprintf(stderr, "mp_launch: rank %d returned %d, not an exit status: exiting 1\n", rank, rc);
  return 1;
}

/* ---- the child ------------------------------------------------------------------------ */
typedef struct {
  int W;
  size_t blob_size;
  mp_make_blob_fn make_blob;
  mp_child_fn child;
  void* ctx;
  int (*blobp)[2]; /* blobp[r], r >= 1: rank 0 -> rank r */
  int (*outp)[2];  /* outp[r]: rank r's stdout + stderr -> parent */
  pid_t pgid;      /* rank 0's pid (0 in rank 0 itself) */
  pid_t parent;
} launch_t;

_Noreturn static void child_main(const launch_t* L, int r) {
  /* join (rank 0: create) the launch's process group; the parent does the same from its
     side, so whichever runs first wins the race */
  setpgid(0, r == 0 ? 0 : L->pgid);
#ifdef __linux__
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != L->parent) _exit(MP_EXIT_LAUNCHER); /* the parent died before prctl */
#endif
  /* stdout and stderr into this rank's output pipe; stdout line-buffered (the parent
     flushed stdio before fork, so the inherited buffers are empty) */
  if (dup2(L->outp[r][1], STDOUT_FILENO) < 0 || dup2(L->outp[r][1], STDERR_FILENO) < 0)
    _exit(MP_EXIT_LAUNCHER);
  setvbuf(stdout, NULL, _IOLBF, BUFSIZ);
  /* close every launcher fd this rank does not use: a rank r > 0 holding any blob write
     end would never see EOF when rank 0 fails */
  for (int q = 0; q < L->W; q++) {
    close(L->outp[q][0]);
    close(L->outp[q][1]);
    if (q == 0) continue;
    if (r != 0) close(L->blobp[q][1]);
    if (q != r) close(L->blobp[q][0]);
  }
  size_t n = L->blob_size;
  unsigned char* blob = (unsigned char*)calloc(n ? n : 1, 1);
  if (blob == NULL) {
    fprintf(stderr, "mp_launch: rank %d: out of memory for the %zu-byte blob\n", r, n);
    _exit(MP_EXIT_LAUNCHER);
  }
  if (r == 0) {
    int rc = L->make_blob ? L->make_blob(blob, n, L->ctx) : 0;
    if (rc != 0) {
      if (L->W > 1)
        fprintf(stderr,
                "mp_launch: rank 0: make_blob failed (%d); closing the blob pipes so that "
                "ranks 1..%d exit\n",
                rc, L->W - 1);
      else
        fprintf(stderr, "mp_launch: rank 0: make_blob failed (%d)\n", rc);
      fflush(NULL);
      for (int q = 1; q < L->W; q++) close(L->blobp[q][1]);
      _exit(rc >= 1 && rc <= 255 ? rc : 1);
    }
    /* a rank that already died must not kill rank 0 with SIGPIPE: report and go on (that
       rank's own status shows the failure) */
    struct sigaction ign, old;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &old);
    for (int q = 1; q < L->W; q++) {
      if (write_all(L->blobp[q][1], blob, n) != 0)
        fprintf(stderr, "mp_launch: rank 0: could not send the blob to rank %d: %s\n", q,
                strerror(errno));
      close(L->blobp[q][1]);
    }
    sigaction(SIGPIPE, &old, NULL);
  } else {
    size_t got = read_all(L->blobp[r][0], blob, n);
    /* nothing may follow the blob: rank 0 closes the pipe after it */
    unsigned char extra;
    if (got == n && read_all(L->blobp[r][0], &extra, 1) != 0) {
      fprintf(stderr, "mp_launch: rank %d: more than %zu bytes arrived on the blob pipe\n", r, n);
      fflush(NULL);
      _exit(MP_EXIT_LAUNCHER);
    }
    close(L->blobp[r][0]);
    if (got != n) {
      fprintf(stderr,
              "mp_launch: rank %d: no blob from rank 0 (EOF after %zu of %zu bytes): rank 0 "
              "failed or died\n",
              r, got, n);
      fflush(NULL);
      _exit(MP_EXIT_NO_BLOB);
    }
  }
  int rc = L->child(r, L->W, blob, L->ctx);
  free(blob);
  rc = exit_code(r, rc);
  fflush(NULL);
  _exit(rc);
}

/* ---- the parent: output relay ----------------------------------------------------------- */
typedef struct {
  int fd;    /* read end, -1 at EOF */
  char* buf; /* a partial line */
  size_t len, cap;
  char prefix[24];
} relay_t;

/* Writes "<prefix><line>\n" in one write (lines up to the buffer size; longer ones in
   pieces). */
static void relay_emit(const relay_t* o, const char* line, size_t n) {
  char out[4096];
  size_t pl = strlen(o->prefix);
  while (1) {
    size_t take = n < sizeof out - pl - 1 ? n : sizeof out - pl - 1;
    memcpy(out, o->prefix, pl);
    memcpy(out + pl, line, take);
    out[pl + take] = '\n';
    (void)write_all(STDERR_FILENO, out, pl + take + 1);
    line += take;
    n -= take;
    if (n == 0) break;
  }
}

/* Moves every complete line out of o->buf; with `all`, also the partial rest. */
static void relay_flush(relay_t* o, int all) {
  size_t start = 0;
  for (size_t i = 0; i < o->len; i++) {
    if (o->buf[i] != '\n') continue;
    relay_emit(o, o->buf + start, i - start);
    start = i + 1;
  }
  if (all && start < o->len) {
    relay_emit(o, o->buf + start, o->len - start);
    start = o->len;
  }
  memmove(o->buf, o->buf + start, o->len - start);
  o->len -= start;
  /* a line longer than 64 KiB: pass it on in pieces rather than grow without bound */
  if (o->len > 65536) {
    relay_emit(o, o->buf, o->len);
    o->len = 0;
  }
}

/* Reads what is available (the fd is non-blocking). */
static void relay_read(relay_t* o) {
  while (o->fd >= 0) {
    if (o->cap - o->len < 4096) {
      size_t cap = o->cap ? o->cap * 2 : 8192;
      char* b = (char*)realloc(o->buf, cap);
      if (b == NULL) { /* keep going with what fits */
        relay_flush(o, 1);
        if (o->cap - o->len < 1) return;
      } else {
        o->buf = b;
        o->cap = cap;
      }
    }
    ssize_t r = read(o->fd, o->buf + o->len, o->cap - o->len);
    if (r > 0) {
      o->len += (size_t)r;
      relay_flush(o, 0);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    close_fd(&o->fd); /* EOF or an error */
    relay_flush(o, 1);
  }
}

/* Polls every open relay fd for up to ms milliseconds and relays what arrived. */
static void relay_poll(relay_t* rel, int W, int ms) {
  struct pollfd pf[MP_MAX_RANKS];
  int idx[MP_MAX_RANKS], n = 0;
  for (int r = 0; r < W; r++)
    if (rel[r].fd >= 0) {
      pf[n].fd = rel[r].fd;
      pf[n].events = POLLIN;
      pf[n].revents = 0;
      idx[n++] = r;
    }
  int k = poll(n ? pf : NULL, (nfds_t)n, ms);
  if (k <= 0) return;
  for (int i = 0; i < n; i++)
    if (pf[i].revents) relay_read(&rel[idx[i]]);
}

/* ---- the parent: status ----------------------------------------------------------------- */
static void describe(const mp_rank_status_t* s, char* buf, size_t n) {
  switch (s->state) {
    case MP_RANK_EXITED:
      if (s->code == MP_EXIT_NO_BLOB)
        snprintf(buf, n, "exit %d (no blob from rank 0)", s->code);
      else if (s->code == MP_EXIT_LAUNCHER)
        snprintf(buf, n, "exit %d (launcher setup failed in the child)", s->code);
      else if (s->code == MP_SKIP)
        snprintf(buf, n, "exit %d (skipped)", s->code);
      else
        snprintf(buf, n, "exit %d", s->code);
      break;
    case MP_RANK_SIGNALED:
      snprintf(buf, n, "killed by signal %d (%s)", s->code, strsignal(s->code));
      break;
    case MP_RANK_HUNG:
      snprintf(buf, n, "hung: killed with SIGKILL at the timeout");
      break;
    case MP_RANK_LOST:
      snprintf(buf, n, "hung and could not be reaped after SIGKILL");
      break;
    case MP_RANK_STOPPED:
      snprintf(buf, n, "still running after another rank failed: killed with SIGKILL");
      break;
    default:
      snprintf(buf, n, "not started");
      break;
  }
}

static void record(mp_rank_status_t* s, int wstatus) {
  if (WIFEXITED(wstatus)) {
    s->state = MP_RANK_EXITED;
    s->code = WEXITSTATUS(wstatus);
  } else if (WIFSIGNALED(wstatus)) {
    s->state = MP_RANK_SIGNALED;
    s->code = WTERMSIG(wstatus);
  }
}

int mp_run(int W, size_t blob_size, mp_make_blob_fn make_blob, mp_child_fn child, void* ctx,
           double timeout_s) {
  return mp_run_ex(W, blob_size, make_blob, child, ctx, timeout_s, NULL);
}

int mp_run_ex(int W, size_t blob_size, mp_make_blob_fn make_blob, mp_child_fn child, void* ctx,
              double timeout_s, mp_rank_status_t* status) {
  mp_opts_t o = {timeout_s, -1.0};
  return mp_run_opts(W, blob_size, make_blob, child, ctx, &o, status);
}

static int failed(const mp_rank_status_t* s) {
  return (s->state == MP_RANK_EXITED && s->code != 0 && s->code != MP_SKIP) ||
         s->state == MP_RANK_SIGNALED;
}

int mp_run_opts(int W, size_t blob_size, mp_make_blob_fn make_blob, mp_child_fn child, void* ctx,
                const mp_opts_t* opts, mp_rank_status_t* status) {
  double timeout_s = opts ? opts->timeout_s : 0.0;
  double fail_fast_s = opts ? opts->fail_fast_s : -1.0;
  if (W < 1 || W > MP_MAX_RANKS || child == NULL) {
    say("mp_run: W must be in 1..%d and child non-NULL (W = %d)", MP_MAX_RANKS, W);
    return 1;
  }
  int(*blobp)[2] = (int(*)[2])malloc((size_t)W * sizeof *blobp);
  int(*outp)[2] = (int(*)[2])malloc((size_t)W * sizeof *outp);
  pid_t* pid = (pid_t*)calloc((size_t)W, sizeof *pid);
  int* done = (int*)calloc((size_t)W, sizeof *done);
  relay_t* rel = (relay_t*)calloc((size_t)W, sizeof *rel);
  mp_rank_status_t* st = (mp_rank_status_t*)calloc((size_t)W, sizeof *st);
  int result = 1;
  if (!blobp || !outp || !pid || !done || !rel || !st) {
    say("mp_run: out of memory");
    goto out;
  }
  for (int r = 0; r < W; r++) {
    blobp[r][0] = blobp[r][1] = outp[r][0] = outp[r][1] = -1;
    rel[r].fd = -1;
  }
  /* every pipe exists before the first fork: each child inherits all, keeps its own */
  for (int r = 0; r < W; r++) {
    if ((r > 0 && make_pipe(blobp[r]) != 0) || make_pipe(outp[r]) != 0) {
      say("mp_run: pipe: %s", strerror(errno));
      goto close_pipes;
    }
  }

  launch_t L = {W, blob_size, make_blob, child, ctx, blobp, outp, 0, getpid()};
  fflush(NULL); /* or the children would print the parent's buffered output again */
  int forked = 0;
  for (int r = 0; r < W; r++) {
    pid_t p = fork();
    if (p == 0) child_main(&L, r);
    if (p < 0) {
      say("mp_run: fork (rank %d of %d): %s", r, W, strerror(errno));
      break;
    }
    pid[r] = p;
    st[r].pid = (long)p;
    st[r].state = MP_RANK_HUNG; /* until reaped */
    if (r == 0) L.pgid = p;
    setpgid(p, L.pgid); /* may fail if the child already did it, or already exited: fine */
    forked++;
  }
  /* the parent keeps only the output read ends */
  for (int r = 0; r < W; r++) {
    close_fd(&blobp[r][0]);
    close_fd(&blobp[r][1]);
    close_fd(&outp[r][1]);
    rel[r].fd = outp[r][0];
    outp[r][0] = -1;
    if (rel[r].fd >= 0) fcntl(rel[r].fd, F_SETFL, fcntl(rel[r].fd, F_GETFL) | O_NONBLOCK);
    snprintf(rel[r].prefix, sizeof rel[r].prefix, "[rank %d] ", r);
  }
  if (forked < W) { /* a fork failed: stop the ones started */
    if (forked > 0) kill(-L.pgid, SIGKILL);
    for (int r = 0; r < forked; r++) kill(pid[r], SIGKILL);
  }

  /* wait, relaying output */
  double t0 = mp_now_s(), t_fail = -1.0;
  int left = forked, timed_out = 0, stopped = 0;
  while (left > 0) {
    relay_poll(rel, W, 20);
    for (int r = 0; r < forked; r++) {
      if (done[r]) continue;
      int ws = 0;
      pid_t w = waitpid(pid[r], &ws, WNOHANG);
      if (w == pid[r]) {
        record(&st[r], ws);
        done[r] = 1;
        left--;
        if (t_fail < 0 && failed(&st[r])) t_fail = mp_now_s();
      } else if (w < 0 && errno != EINTR) { /* cannot happen for our own child */
        say("mp_run: waitpid(rank %d): %s", r, strerror(errno));
        st[r].state = MP_RANK_LOST;
        done[r] = 1;
        left--;
      }
    }
    if (left > 0 && timeout_s > 0 && mp_now_s() - t0 > timeout_s) {
      timed_out = 1;
      break;
    }
    if (left > 0 && fail_fast_s >= 0 && t_fail >= 0 && mp_now_s() - t_fail > fail_fast_s) {
      stopped = 1;
      break;
    }
  }
  if (timed_out || stopped) {
    char list[1024];
    size_t off = 0;
    list[0] = '\0';
    for (int r = 0; r < forked; r++)
      if (!done[r] && off < sizeof list - 16)
        off += (size_t)snprintf(list + off, sizeof list - off, "%s%d", off ? ", " : "", r);
    if (timed_out)
      say("mp_run: timeout after %.1f s: rank(s) %s of %d still running (hung); killing the "
          "process group with SIGKILL",
          timeout_s, list, W);
    else
      say("mp_run: a rank failed and rank(s) %s of %d still run %.1f s later; killing the "
          "process group with SIGKILL",
          list, W, fail_fast_s);
    kill(-L.pgid, SIGKILL);
    for (int r = 0; r < forked; r++)
      if (!done[r]) kill(pid[r], SIGKILL);
    /* SIGKILL cannot be caught; a process in uninterruptible sleep (a driver call) may
       still take a moment: wait for it, bounded */
    double t1 = mp_now_s();
    while (left > 0 && mp_now_s() - t1 < 10.0) {
      relay_poll(rel, W, 20);
      for (int r = 0; r < forked; r++) {
        if (done[r]) continue;
        int ws = 0;
        if (waitpid(pid[r], &ws, WNOHANG) == pid[r]) {
          /* killed by us, whatever the status says */
          st[r].state = timed_out ? MP_RANK_HUNG : MP_RANK_STOPPED;
          done[r] = 1;
          left--;
        }
      }
    }
    for (int r = 0; r < forked; r++)
      if (!done[r]) st[r].state = MP_RANK_LOST;
  }
  /* what is left in the pipes (a grandchild may hold one open: do not wait for EOF) */
  for (int r = 0; r < W; r++) {
    relay_read(&rel[r]);
    relay_flush(&rel[r], 1);
  }

  /* aggregate */
  int n0 = 0, n77 = 0;
  for (int r = 0; r < W; r++) {
    if (st[r].state == MP_RANK_EXITED && st[r].code == 0) n0++;
    if (st[r].state == MP_RANK_EXITED && st[r].code == MP_SKIP) n77++;
  }
  result = n0 == W ? 0 : n77 == W ? MP_SKIP : 1;
  if (result == 1) {
    say("mp_run: W = %d: FAILED%s; per rank:", W,
        timed_out ? " (timeout)"
        : stopped ? " (fail-fast)"
                  : "");
    for (int r = 0; r < W; r++) {
      char d[128];
      describe(&st[r], d, sizeof d);
      say("mp_run:   rank %d (pid %ld): %s", r, st[r].pid, d);
    }
  }

close_pipes:
  for (int r = 0; r < W; r++) {
    close_fd(&blobp[r][0]);
    close_fd(&blobp[r][1]);
    close_fd(&outp[r][0]);
    close_fd(&outp[r][1]);
    close_fd(&rel[r].fd);
    free(rel[r].buf);
  }
  if (status) memcpy(status, st, (size_t)W * sizeof *st);
out:
  free(blobp);
  free(outp);
  free(pid);
  free(done);
  free(rel);
  free(st);
  return result;
}

/* ---- one question answered in a child ---------------------------------------------------- */
int mp_call_in_child(int (*fn)(void* out, size_t size, void* ctx), void* ctx, void* out,
                     size_t size, double timeout_s) {
  int p[2];
  if (fn == NULL || (size > 0 && out == NULL)) return -1;
  if (make_pipe(p) != 0) {
    say("mp_call_in_child: pipe: %s", strerror(errno));
    return -1;
  }
  fflush(NULL);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    say("mp_call_in_child: fork: %s", strerror(errno));
    close(p[0]);
    close(p[1]);
    return -1;
  }
  if (pid == 0) {
#ifdef __linux__
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(MP_EXIT_LAUNCHER);
#else
    (void)parent;
#endif
    close(p[0]);
    unsigned char* buf = (unsigned char*)calloc(size ? size : 1, 1);
    if (buf == NULL) _exit(MP_EXIT_LAUNCHER);
    int rc = exit_code(0, fn(buf, size, ctx));
    fflush(NULL);
    if (write_all(p[1], buf, size) != 0) _exit(MP_EXIT_LAUNCHER);
    close(p[1]);
    free(buf);
    _exit(rc);
  }
  close(p[1]);
  fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
  unsigned char* buf = (unsigned char*)malloc(size ? size : 1);
  size_t got = 0;
  int eof = 0, reaped = 0, ws = 0, result = -1;
  double t0 = mp_now_s();
  while (!reaped || !eof) {
    if (!eof) {
      struct pollfd pf = {p[0], POLLIN, 0};
      if (poll(&pf, 1, 20) > 0) {
        for (;;) {
          unsigned char tmp[4096];
          ssize_t r = read(p[0], tmp, sizeof tmp);
          if (r > 0) {
            size_t keep = got < size ? size - got : 0;
            if ((size_t)r < keep) keep = (size_t)r;
            if (buf && keep) memcpy(buf + got, tmp, keep);
            got += (size_t)r; /* counts extra bytes too: more than size is an error */
            continue;
          }
          if (r < 0 && errno == EINTR) continue;
          if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
          eof = 1;
          break;
        }
      }
    } else {
      sleep_s(0.005);
    }
    if (!reaped && waitpid(pid, &ws, WNOHANG) == pid) reaped = 1;
    if (reaped && !eof) { /* the child is gone: whatever it wrote is in the pipe */
      struct pollfd pf = {p[0], POLLIN, 0};
      if (poll(&pf, 1, 0) <= 0) eof = 1;
    }
    if ((!reaped || !eof) && timeout_s > 0 && mp_now_s() - t0 > timeout_s) {
      say("mp_call_in_child: the child (pid %ld) did not finish within %.1f s: killed", (long)pid,
          timeout_s);
      kill(pid, SIGKILL);
      if (!reaped) waitpid(pid, &ws, 0);
      reaped = 1;
      eof = 1;
      got = (size_t)-1; /* mark as failed */
    }
  }
  close(p[0]);
  if (got == size && WIFEXITED(ws)) {
    if (size) memcpy(out, buf, size);
    result = WEXITSTATUS(ws);
  } else if (got != (size_t)-1) {
    if (WIFSIGNALED(ws))
      say("mp_call_in_child: the child died from signal %d (%s)", WTERMSIG(ws),
          strsignal(WTERMSIG(ws)));
    else
      say("mp_call_in_child: the child sent %zu bytes, expected %zu", got, size);
  }
  free(buf);
  return result;
}
