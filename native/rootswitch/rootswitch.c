/* rollstack-rootswitch: give a started container the root the node mounted over it.
 *
 * A late-bound sandbox (rollstack.run.lateroot) is a runc container started on an empty
 * directory, the host's <env>/rootfs, which the node bound onto itself as a shared mount before
 * `runc run`: the container's root is a slave of it. When the node later mounts an environment's
 * overlay at <env>/rootfs, the mount propagates into the container, stacked over its root, where
 * no process sees it yet. This program, run by the node as host root, switches the container
 * onto it:
 *
 *   rollstack-rootswitch UID GID ENTRY... -- PIDFD:PID:DEV...
 *
 * switches each target (PIDFD: an inherited pidfd of the container's PID 1, PID its pid, DEV the
 * st_dev of the overlay the node mounted for it), all at once, each in a child process of its
 * own (the steps below change the caller's namespace and root), and prints one line per
 * target on stdout as it ends: "N ok" or "N failed" (N counts from 0; the reason is on stderr,
 * "[N] step: error"). It dies with its parent (PR_SET_PDEATHSIG), its per-target children with
 * it. For each target:
 *
 * 1. opens /proc/PID/root (the container's current root: runc's mounts hang off it), then checks
 *    through the pidfd that PID is still that process (no reused pid);
 * 2. joins PID 1's mount namespace (setns on the pidfd): its root is then the topmost mount at the
 *    namespace's root, the propagated overlay, whose st_dev must be DEV (what the node mounted);
 * 3. makes the whole tree private (nothing it moves propagates back to the host);
 * 4. for each ENTRY ("d/proc", "f/.rollstack/init": d a directory, f a file; the top-level mount
 *    destinations of the container's spec) creates the mount point in the new root when missing
 *    (owned by UID:GID, the environment's root; never through a symlink) and moves the mount there
 *    with its submounts (masked and read-only paths move with /proc and /sys);
 * 5. pivot_root: PID 1's root and cwd become the new root; the old one is detached.
 *
 * Nothing in the container runs during the switch but PID 1 (rollstack-execd, idle). Exit 0 when
 * every target switched, 1 when one failed (the node then destroys that sandbox and creates its
 * environment cold), 2 on bad arguments. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static int target_index = -1;

static void die(const char *fmt, ...) {
    va_list ap;
    int e = errno;
    fprintf(stderr, "rootswitch: [%d] ", target_index);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, ": %s\n", strerror(e));
    exit(1);
}

static long num(const char *s, const char *what) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *s == '\0' || *end != '\0' || v < 0) {
        errno = EINVAL;
        die("%s %s", what, s);
    }
    return (long)v;
}

/* The mount point `rel` (no leading '/') under `root`, created where missing: an O_PATH fd. */
static int mount_point(int root, char *rel, int is_file, uid_t uid, gid_t gid) {
    int cur = dup(root);
    if (cur < 0)
        die("dup");
    char *save = NULL;
    char *comp = strtok_r(rel, "/", &save);
    while (comp != NULL) {
        char *next = strtok_r(NULL, "/", &save);
        int last = next == NULL;
        if (strcmp(comp, ".") == 0 || strcmp(comp, "..") == 0) {
            errno = EINVAL;
            die("mount point component %s", comp);
        }
        int fd;
        if (last && is_file) {
            int made = openat(cur, comp, O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0755);
            if (made >= 0) {
                if (fchown(made, uid, gid) != 0)
                    die("chown %s", comp);
                close(made);
            } else if (errno != EEXIST) {
                die("create %s", comp);
            }
            fd = openat(cur, comp, O_PATH | O_NOFOLLOW | O_CLOEXEC);
            struct stat st;
            if (fd < 0 || fstat(fd, &st) != 0)
                die("open %s", comp);
            if (!S_ISREG(st.st_mode)) {
                errno = EINVAL;
                die("%s is not a regular file", comp);
            }
        } else {
            if (mkdirat(cur, comp, 0755) == 0) {
                if (fchownat(cur, comp, uid, gid, AT_SYMLINK_NOFOLLOW) != 0)
                    die("chown %s", comp);
            } else if (errno != EEXIST) {
                die("mkdir %s", comp);
            }
            fd = openat(cur, comp, O_PATH | O_NOFOLLOW | O_DIRECTORY | O_CLOEXEC);
            if (fd < 0)
                die("open directory %s", comp);
        }
        close(cur);
        cur = fd;
        comp = next;
    }
    return cur;
}

/* One target, in a child process: exits 0 when switched, 1 (die) otherwise. */
static void switch_one(int pidfd, long pid, dev_t dev, uid_t uid, gid_t gid, char **entries, int n) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/root", pid);
    int old = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (old < 0)
        die("open %s", path);
    if (syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) != 0)
        die("pid %ld is not the container's init any more", pid);
    if (setns(pidfd, CLONE_NEWNS) != 0)
        die("setns into the mount namespace of %ld", pid);
    int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    struct stat st_new, st_old;
    if (root < 0 || fstat(root, &st_new) != 0 || fstat(old, &st_old) != 0)
        die("stat the roots");
    if (st_new.st_dev != dev || st_old.st_dev == dev) {
        errno = ESTALE;
        die("the namespace's top root (dev %lu) is not the bound overlay (dev %lu)",
            (unsigned long)st_new.st_dev, (unsigned long)dev);
    }
    if (fchdir(old) != 0 || chroot(".") != 0)
        die("chroot to the old root");
    if (mount(NULL, ".", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        die("make the tree private");
    for (int i = 0; i < n; i++) {
        char rel[4096];
        snprintf(rel, sizeof rel, "%s", entries[i] + 2);
        int target = mount_point(root, rel, entries[i][0] == 'f', uid, gid);
        if (syscall(SYS_move_mount, old, entries[i] + 2, target, "", MOVE_MOUNT_T_EMPTY_PATH) != 0)
            die("move %s", entries[i] + 1);
        close(target);
    }
    if (fchdir(root) != 0)
        die("chdir to the new root");
    if (syscall(SYS_pivot_root, ".", ".") != 0)
        die("pivot_root");
    if (umount2(".", MNT_DETACH) != 0)
        die("detach the old root");
    exit(0);
}

static void report(int i, int ok, int *failed) {
    printf("%d %s\n", i, ok ? "ok" : "failed");
    fflush(stdout);
    *failed |= !ok;
}

int main(int argc, char **argv) {
    /* the node runs this from a thread that waits for it: if the node dies, so does the switch
     * (and with it each target's child, tied to this process below) */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
        perror("rootswitch: prctl");
        return 2;
    }
    int sep = 0;
    for (int i = 3; i < argc; i++)
        if (strcmp(argv[i], "--") == 0) {
            sep = i;
            break;
        }
    if (argc < 5 || sep == 0 || sep == argc - 1) {
        fprintf(stderr, "usage: %s UID GID [d/DIR|f/FILE]... -- PIDFD:PID:DEV...\n", argv[0]);
        return 2;
    }
    uid_t uid = (uid_t)num(argv[1], "uid");
    gid_t gid = (gid_t)num(argv[2], "gid");
    for (int i = 3; i < sep; i++) {
        char *e = argv[i];
        if ((e[0] != 'd' && e[0] != 'f') || e[1] != '/' || e[2] == '\0') {
            errno = EINVAL;
            die("entry %s", e);
        }
    }
    /* every target in a child of its own, all at once: most of a switch is waiting (the old
     * root's detach waits for an RCU grace period), which the children overlap */
    int n = argc - sep - 1, failed = 0;
    pid_t *kids = calloc((size_t)n, sizeof *kids);
    if (kids == NULL)
        die("calloc");
    fflush(stdout);
    fflush(stderr);
    const pid_t self = getpid();
    for (int i = 0; i < n; i++) {
        int pidfd;
        long pid;
        unsigned long long dev;
        char tail;
        target_index = i;
        kids[i] = -1;
        if (sscanf(argv[sep + 1 + i], "%d:%ld:%llu%c", &pidfd, &pid, &dev, &tail) != 3 || pidfd < 0 || pid <= 0) {
            fprintf(stderr, "rootswitch: [%d] bad target %s\n", i, argv[sep + 1 + i]);
            continue;
        }
        kids[i] = fork();
        if (kids[i] < 0)
            fprintf(stderr, "rootswitch: [%d] fork: %s\n", i, strerror(errno));
        if (kids[i] == 0) {
            /* dies with this process: the node kills a switch that hangs (a dead FUSE lower) */
            if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != self)
                die("tie to the switch's life");
            switch_one(pidfd, pid, (dev_t)dev, uid, gid, argv + 3, sep - 3);
        }
    }
    /* each outcome is printed (and flushed) as its child ends: a node that kills a switch that
     * hangs still learns which targets had switched */
    int left = 0;
    for (int i = 0; i < n; i++) {
        if (kids[i] > 0)
            left++;
        else
            report(i, 0, &failed);
    }
    while (left > 0) {
        int status = 1;
        pid_t done = waitpid(-1, &status, 0);
        if (done < 0) {
            if (errno == EINTR)
                continue;
            break; /* ECHILD: none left */
        }
        for (int i = 0; i < n; i++)
            if (kids[i] == done) {
                report(i, WIFEXITED(status) && WEXITSTATUS(status) == 0, &failed);
                kids[i] = -1;
                left--;
            }
    }
    free(kids);
    return failed;
}
