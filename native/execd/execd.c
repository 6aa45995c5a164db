/*
 * rollstack-execd: PID 1 of every rollstack environment and its in-sandbox exec agent.
 *
 * Started by runc as the container's init (`/.rollstack/init`), with fd 3 a listening unix
 * socket that the node bound in the environment's host state dir (`runc run --preserve-fds 1`).
 * The socket is never visible inside the container's filesystem. Without such an fd execd is a
 * plain zombie reaper (like `catatonit -P`). SIGUSR1 from outside the environment's pid
 * namespace moves the listener into the environment (before a CRIU checkpoint, which cannot dump
 * a socket the node made in its own network namespace): fd 3 becomes, in one dup3, a listening
 * socket execd makes itself, at the abstract address "\0rollstack-execd" of the environment's
 * network namespace, which CRIU dumps and restores with the processes. The node connects to it
 * from a thread that joined that namespace, and checks that the peer is this PID 1
 * (SO_PEERCRED). If the address is taken (by the environment's own processes), execd has no
 * listener from then on and the node runs commands with `runc exec`. Since the environment's
 * processes can reach that address, execd serves only peers outside its pid namespace (their
 * SO_PEERCRED pid reads 0: the node), on either listener, and closes the rest unserved.
 *
 * Every exec is one connection. execd forks a "shim" per connection (a child subreaper, so the
 * command's whole tree, double-forked daemons included, stays below it); the shim reads the
 * request, forks the command in a new session, and reports its wait status. The command
 * inherits PID 1's namespaces, cgroup, capabilities, seccomp filter, no_new_privileges, rlimits
 * and environment: the same sandbox as `runc exec` gives, without starting runc.
 *
 * Protocol (all integers little-endian; see docs/runtime.md):
 *   request  host -> shim: "RSX1" u32 body_len, body; SCM_RIGHTS with 3 fds (stdin, stdout,
 *            stderr) on the first byte. body = records of one tag byte + a NUL-terminated
 *            string: 'a' argv element (in order), 'e' "KEY=VALUE" (overrides PID 1's env),
 *            'c' cwd.
 *   control  host -> shim: 'K' = kill the command's whole tree now (timeout). EOF (the node
 *            went away or gave up) does the same. A 'K' or EOF already there when the shim has
 *            read the request: the command is never started ('K': status SIGKILL). 'S' u8
 *            signo = send signo to the command's process group (it runs in a session of its
 *            own); an invalid signo is ignored.
 *   replies  shim -> host: tag byte + u32 len + payload: 'X' i32 wait status (the command's
 *            end; always the last message), 'E' error text (the command did not start).
 * A command that cannot be executed (not found, not executable) starts and exits 127/126 with
 * the reason on its stderr, as a shell does.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define LISTEN_FD 3
#define NETNS_ADDRESS "rollstack-execd" /* abstract: sun_path[0] is NUL */
#define MAX_BODY (8u << 20)
#define MAX_ARGS 65536
#define KILL_ROUNDS 500
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

extern char **environ;

static int sigfd_for(int signo_a, int signo_b, int signo_c, int signo_d) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, signo_a);
    if (signo_b) sigaddset(&set, signo_b);
    if (signo_c) sigaddset(&set, signo_c);
    if (signo_d) sigaddset(&set, signo_d);
    sigprocmask(SIG_BLOCK, &set, NULL);
    return signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
}

static int send_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static void reply(int conn, char tag, const void *payload, uint32_t len) {
    char head[5];
    head[0] = tag;
    memcpy(head + 1, &len, 4);
    if (send_all(conn, head, 5) == 0 && len) send_all(conn, payload, len);
}

static void reply_error(int conn, const char *fmt, ...) {
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof text) n = sizeof text - 1;
    reply(conn, 'E', text, (uint32_t)n);
}

static int read_full(int fd, char *buf, size_t len) {
    while (len) {
        ssize_t n = read(fd, buf, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* ---- the command's process tree (run in the shim, a child subreaper) ---------------------- */

/* Appends the children of `pid` (every thread's) to `out`; returns the new count. */
static size_t children_of(pid_t pid, pid_t *out, size_t n, size_t cap) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d) return n;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char cpath[320];
        snprintf(cpath, sizeof cpath, "/proc/%d/task/%s/children", (int)pid, e->d_name);
        FILE *f = fopen(cpath, "re");
        if (!f) continue;
        int kid;
        while (n < cap && fscanf(f, "%d", &kid) == 1) out[n++] = (pid_t)kid;
        fclose(f);
    }
    closedir(d);
    return n;
}

static int main_done;
static int main_status;
static pid_t main_pid;

static void reap_all(void) {
    int st;
    pid_t p;
    while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
        if (p == main_pid && !main_done) {
            main_done = 1;
            main_status = st;
        }
    }
}

/* SIGKILL every descendant until none is left. Orphans of the tree are re-parented to us (we are
 * a child subreaper), so "descendants of the shim" is exactly the command's tree. */
static void kill_tree(int sigfd) {
    static pid_t found[65536];
    if (main_pid > 0) kill(-main_pid, SIGKILL); /* its process group: most of the tree at once */
    for (int round = 0; round < KILL_ROUNDS; round++) {
        size_t n = children_of(getpid(), found, 0, sizeof found / sizeof found[0]);
        for (size_t i = 0; i < n && n < sizeof found / sizeof found[0]; i++)
            n = children_of(found[i], found, n, sizeof found / sizeof found[0]);
        for (size_t i = 0; i < n; i++) kill(found[i], SIGKILL);
        reap_all();
        if (n == 0) return;
        struct pollfd p = {.fd = sigfd, .events = POLLIN};
        if (poll(&p, 1, 10) > 0) {
            struct signalfd_siginfo si;
            while (read(sigfd, &si, sizeof si) == sizeof si) {}
        }
    }
}

/* ---- one exec ------------------------------------------------------------------------------ */

struct request {
    char *argv[MAX_ARGS + 1];
    int argc;
    char **envp;
    const char *cwd;
    int fds[3];
};

static int setenv_in(char ***envp, size_t *n, size_t *cap, char *kv) {
    size_t klen = strchr(kv, '=') - kv;
    for (size_t i = 0; i < *n; i++) {
        if (strncmp((*envp)[i], kv, klen) == 0 && (*envp)[i][klen] == '=') {
            (*envp)[i] = kv;
            return 0;
        }
    }
    if (*n + 1 >= *cap) {
        size_t ncap = *cap * 2 + 16;
        char **grown = realloc(*envp, ncap * sizeof *grown);
        if (!grown) return -1;
        *envp = grown;
        *cap = ncap;
    }
    (*envp)[(*n)++] = kv;
    (*envp)[*n] = NULL;
    return 0;
}

/* Reads and parses the request; on error replies 'E' and returns -1. */
static int read_request(int conn, struct request *rq) {
    char head[8];
    char cbuf[CMSG_SPACE(3 * sizeof(int))];
    struct iovec iov = {.iov_base = head, .iov_len = sizeof head};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                         .msg_controllen = sizeof cbuf};
    rq->fds[0] = rq->fds[1] = rq->fds[2] = -1;
    ssize_t got;
    do {
        got = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    } while (got < 0 && errno == EINTR);
    if (got != (ssize_t)sizeof head) {
        reply_error(conn, "protocol: short request header");
        return -1;
    }
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
            c->cmsg_len == CMSG_LEN(3 * sizeof(int)))
            memcpy(rq->fds, CMSG_DATA(c), 3 * sizeof(int));
    }
    if (memcmp(head, "RSX1", 4) != 0 || rq->fds[0] < 0 || (msg.msg_flags & MSG_CTRUNC)) {
        reply_error(conn, "protocol: bad request header or missing stdio fds");
        return -1;
    }
    uint32_t len;
    memcpy(&len, head + 4, 4);
    if (len > MAX_BODY) {
        reply_error(conn, "protocol: request of %u bytes is too large", len);
        return -1;
    }
    char *body = malloc(len + 1);
    if (!body || read_full(conn, body, len) < 0) {
        reply_error(conn, "protocol: short request body");
        return -1;
    }
    body[len] = '\0';
    size_t n = 0, cap = 64;
    for (char **e = environ; *e; e++) cap++;
    rq->envp = malloc(cap * sizeof(char *));
    if (!rq->envp) return -1;
    for (char **e = environ; *e; e++) rq->envp[n++] = *e;
    rq->envp[n] = NULL;
    rq->argc = 0;
    rq->cwd = NULL;
    for (size_t i = 0; i < len;) {
        char tag = body[i];
        char *s = body + i + 1;
        size_t slen = strnlen(s, len - i - 1);
        if (i + 1 + slen >= len) { /* the record's NUL must lie inside the body */
            reply_error(conn, "protocol: unterminated record");
            return -1;
        }
        if (tag == 'a') {
            if (rq->argc >= MAX_ARGS) {
                reply_error(conn, "too many arguments");
                return -1;
            }
            rq->argv[rq->argc++] = s;
        } else if (tag == 'e') {
            if (!strchr(s, '=') || s[0] == '=') {
                reply_error(conn, "invalid environment variable");
                return -1;
            }
            if (setenv_in(&rq->envp, &n, &cap, s) < 0) return -1;
        } else if (tag == 'c') {
            rq->cwd = s;
        } else {
            reply_error(conn, "protocol: unknown record tag 0x%02x", (unsigned char)tag);
            return -1;
        }
        i += 1 + slen + 1;
    }
    rq->argv[rq->argc] = NULL;
    if (rq->argc == 0) {
        reply_error(conn, "protocol: empty argv");
        return -1;
    }
    return 0;
}

static const char *env_get(char **envp, const char *key) {
    size_t klen = strlen(key);
    for (; *envp; envp++)
        if (strncmp(*envp, key, klen) == 0 && (*envp)[klen] == '=') return *envp + klen + 1;
    return NULL;
}

/* In the command's process: place stdio, exec argv[0] (PATH of the command's own env). */
static void exec_command(struct request *rq, int errfd) {
    int tmp[3];
    for (int i = 0; i < 3; i++) tmp[i] = fcntl(rq->fds[i], F_DUPFD_CLOEXEC, 10);
    for (int i = 0; i < 3; i++) {
        if (tmp[i] < 0 || dup2(tmp[i], i) < 0) _exit(126);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setsid();
    const char *name = rq->argv[0];
    int err = ENOENT;
    if (strchr(name, '/')) {
        execve(name, rq->argv, rq->envp);
        err = errno;
    } else {
        const char *path = env_get(rq->envp, "PATH");
        if (!path) path = DEFAULT_PATH;
        char full[4096];
        int eacces = 0;
        for (const char *p = path;; ) {
            const char *end = strchrnul(p, ':');
            size_t dlen = (size_t)(end - p);
            if (dlen + 1 + strlen(name) + 1 <= sizeof full) {
                if (dlen == 0) snprintf(full, sizeof full, "%s", name);
                else snprintf(full, sizeof full, "%.*s/%s", (int)dlen, p, name);
                execve(full, rq->argv, rq->envp);
                if (errno == EACCES) eacces = 1;
                else if (errno != ENOENT && errno != ENOTDIR) { err = errno; break; }
            }
            if (*end == '\0') { err = eacces ? EACCES : ENOENT; break; }
            p = end + 1;
        }
    }
    int32_t e32 = err;
    if (write(errfd, &e32, 4) != 4) {} /* the shim tells E2BIG to the node; the rest is ours */
    if (err != E2BIG) dprintf(2, "rollstack-execd: %s: %s\n", name, strerror(err));
    _exit(err == ENOENT || err == ENOTDIR ? 127 : 126);
}

static void shim(int conn) {
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    int sigfd = sigfd_for(SIGCHLD, 0, 0, 0);
    static struct request rq;
    if (sigfd < 0 || read_request(conn, &rq) < 0) _exit(1);
    if (rq.cwd && chdir(rq.cwd) < 0) {
        reply_error(conn, "chdir to cwd (\"%s\") set in exec request: %s", rq.cwd, strerror(errno));
        _exit(1);
    }
    /* the node gave up before we read its request (a timeout's 'K', or it hung up): start
     * nothing; a 'K' is answered as a kill of the command before it ran */
    char first = 0;
    ssize_t ahead = recv(conn, &first, 1, MSG_PEEK | MSG_DONTWAIT);
    if (ahead == 0) _exit(0);
    if (ahead == 1 && first == 'K') {
        int32_t st = SIGKILL;
        reply(conn, 'X', &st, 4);
        _exit(0);
    }
    int errpipe[2];
    if (pipe2(errpipe, O_CLOEXEC) < 0) {
        reply_error(conn, "cannot create a pipe: %s", strerror(errno));
        _exit(1);
    }
    main_pid = fork();
    if (main_pid < 0) {
        reply_error(conn, "cannot fork the command: %s", strerror(errno));
        _exit(1);
    }
    if (main_pid == 0) {
        close(conn);
        close(sigfd);
        close(errpipe[0]);
        exec_command(&rq, errpipe[1]);
    }
    for (int i = 0; i < 3; i++) close(rq.fds[i]);
    close(errpipe[1]);
    int32_t exec_errno = 0;
    ssize_t got;
    do { /* EOF: execve succeeded (the pipe is close-on-exec) */
        got = read(errpipe[0], &exec_errno, 4);
    } while (got < 0 && errno == EINTR);
    close(errpipe[0]);
    if (got == 4 && exec_errno == E2BIG) {
        reply_error(conn, "E2BIG: command line or environment too long");
        _exit(1);
    }
    int killed = 0;
    while (!main_done) {
        /* once killed, the connection is not watched: its hang-up would wake poll at once,
         * again and again, while an unkillable command (stuck in the kernel) lingers */
        struct pollfd p[2] = {{.fd = killed ? -1 : conn, .events = POLLIN}, {.fd = sigfd, .events = POLLIN}};
        int r = poll(p, 2, -1);
        if (r < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (p[1].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sigfd, &si, sizeof si) == sizeof si) {}
            reap_all();
        }
        if (!killed && (p[0].revents & (POLLIN | POLLHUP | POLLERR))) {
            char c = 0;
            ssize_t n = recv(conn, &c, 1, MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            if (n == 1 && c == 'S') {
                unsigned char signo = 0;
                ssize_t m;
                do { m = recv(conn, &signo, 1, MSG_WAITALL); } while (m < 0 && errno == EINTR);
                if (m == 1) {
                    if (signo > 0 && signo < NSIG) kill(-main_pid, signo);
                    continue;
                }
            }
            /* 'K' (timeout), EOF or an error (the node is gone): end the whole tree */
            kill_tree(sigfd);
            killed = 1;
            if (n <= 0) _exit(0);
        }
    }
    int32_t st = main_status;
    reply(conn, 'X', &st, 4);
    if (killed) kill_tree(sigfd); /* stragglers that appeared after the main command ended */
    _exit(0);
}

/* ---- PID 1 -------------------------------------------------------------------------------- */

/* Whether the peer of `conn` is outside this pid namespace (SO_PEERCRED reads its pid as 0):
 * the node. Processes of the environment (any uid, nested pid namespaces included) see a pid. */
static int peer_is_node(int conn) {
    struct ucred cred;
    socklen_t len = sizeof cred;
    return getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.pid == 0;
}

/* Serve every connection waiting on `lfd` (non-blocking): a shim per connection from the node;
 * any other peer is closed unserved (after a checkpoint the listener is reachable from inside). */
static void accept_all(int lfd, int sigfd) {
    for (;;) {
        int conn = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0) return;
        if (!peer_is_node(conn)) {
            close(conn);
            continue;
        }
        pid_t pid = fork();
        if (pid == 0) {
            close(lfd);
            close(sigfd);
            shim(conn);
        }
        if (pid < 0) reply_error(conn, "cannot fork: %s", strerror(errno));
        close(conn);
    }
}

/* Replace the listener at fd LISTEN_FD with one at NETNS_ADDRESS in this network namespace,
 * made whole (bound, listening, non-blocking, close-on-exec) before dup3 swaps it in, so the node
 * sees fd LISTEN_FD go from its socket to this one at once; or close it when the address is
 * taken (by the environment's own processes). The node's listener is shut for reading first
 * (its connects are refused from then on: the node runs those commands with `runc exec`) and
 * what it had queued is served, so no connection is reset by the swap. Returns the new listener
 * or -1. */
static int listen_in_netns(int sigfd) {
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path + 1, NETNS_ADDRESS, sizeof NETNS_ADDRESS - 1);
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + sizeof NETNS_ADDRESS - 1);
    int ok = s >= 0 && bind(s, (struct sockaddr *)&a, len) == 0 && listen(s, 512) == 0;
    shutdown(LISTEN_FD, SHUT_RD);
    accept_all(LISTEN_FD, sigfd); /* an exec already queued runs (and CRIU refuses) */
    if (ok && dup3(s, LISTEN_FD, O_CLOEXEC) == LISTEN_FD) {
        close(s);
        return LISTEN_FD;
    }
    if (s >= 0) close(s);
    close(LISTEN_FD);
    return -1;
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int sigfd = sigfd_for(SIGCHLD, SIGTERM, SIGINT, SIGUSR1);
    if (sigfd < 0) return 1;
    struct stat sb;
    int lfd = -1, in_netns = 0;
    if (fstat(LISTEN_FD, &sb) == 0 && S_ISSOCK(sb.st_mode)) {
        lfd = LISTEN_FD;
        fcntl(lfd, F_SETFD, FD_CLOEXEC);
        fcntl(lfd, F_SETFL, fcntl(lfd, F_GETFL) | O_NONBLOCK);
    }
    for (;;) {
        struct pollfd p[2] = {{.fd = sigfd, .events = POLLIN}, {.fd = lfd, .events = POLLIN}};
        int r = poll(p, lfd >= 0 ? 2 : 1, -1);
        if (r < 0) continue;
        if (p[0].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sigfd, &si, sizeof si) == sizeof si) {
                if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) return 0;
                /* checkpoint ahead: listen inside the environment instead; only the node's word
                 * counts (a sender outside this pid namespace reads as pid 0; the environment's
                 * own processes cannot) */
                if (si.ssi_signo == SIGUSR1 && si.ssi_pid == 0 && lfd == LISTEN_FD && !in_netns) {
                    lfd = listen_in_netns(sigfd);
                    in_netns = 1;
                }
            }
            while (waitpid(-1, NULL, WNOHANG) > 0) {}
        }
        if (lfd >= 0 && (p[1].revents & POLLIN)) accept_all(lfd, sigfd);
    }
}
