/*
 * rollstack-treecp SRC DST: copy the directory tree SRC to DST (which must not exist) as it is,
 * like `cp -a --no-target-directory SRC DST`, with fewer system calls per file. It copies an
 * environment's overlay upper while the environment is frozen (a fork's cut), so every
 * microsecond per file is time the environment stands still.
 *
 * Copied: directories, regular files (holes kept for sparse files), symlinks, device nodes
 * (overlayfs whiteouts are 0/0 character devices), fifos and sockets; owner, mode (set-id bits
 * after the owner), access and modification times in nanoseconds, every extended attribute
 * (trusted.overlay.* included) and hard links inside the tree. Nothing is ever followed: the
 * walk goes by directory descriptors with O_NOFOLLOW, so a symlink in SRC is copied as a link.
 *
 * The source may be a live upper (a diff of a running environment): a regular file is opened
 * non-blocking and must still be the inode it was stat'ed as (a file swapped for a device node or
 * a fifo meanwhile fails the copy instead of reading the device or blocking).
 *
 * Exit status: 0 done; 1 a failure (stderr: "rollstack-treecp: PATH: strerror"); 2 bad usage;
 * 3 a tree this tool does not take (deeper than its descriptors or its stack allow, a hard link
 * whose path is too long): the caller copies with cp -a instead; 4 the destination is full
 * (ENOSPC, EDQUOT).
 * On failure DST is left for the caller to remove (it copies into a temporary name).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#define EXIT_FAIL 1
#define EXIT_USAGE 2
#define EXIT_UNSUPPORTED 3
#define EXIT_FULL 4
#define STACK_PER_LEVEL 1024 /* bytes of stack a level may take (~300 measured), with margin */
#define MAX_DEPTH 65536
#define BUF_SIZE (256 * 1024)
#define XATTR_LIST_MAX_ 65536
#define XATTR_SIZE_MAX_ 65536

static char *rel;          /* the current entry's path from DST's parent (DST's name first) */
static size_t rel_len, rel_cap;
static int dst_root = -1;  /* DST's parent directory: hard links are made relative to it */
static int max_depth;
static uid_t euid;
static gid_t egid;
static char buf[BUF_SIZE];

static void fail(const char *what, int err) {
    fprintf(stderr, "rollstack-treecp: %s%s%s: %s\n", rel_len ? rel : ".", what[0] ? ": " : "", what,
            strerror(err));
    exit(err == ENAMETOOLONG ? EXIT_UNSUPPORTED : err == ENOSPC || err == EDQUOT ? EXIT_FULL : EXIT_FAIL);
}

static void unsupported(const char *why) {
    fprintf(stderr, "rollstack-treecp: %s: %s\n", rel_len ? rel : ".", why);
    exit(EXIT_UNSUPPORTED);
}

static size_t rel_push(const char *name) {
    size_t old = rel_len, n = strlen(name);
    if (rel_len + n + 2 > rel_cap) {
        rel_cap = (rel_len + n + 2) * 2;
        if (!(rel = realloc(rel, rel_cap))) fail("out of memory", ENOMEM);
    }
    if (rel_len) rel[rel_len++] = '/';
    memcpy(rel + rel_len, name, n + 1);
    rel_len += n;
    return old;
}

static void rel_pop(size_t old) {
    rel_len = old;
    rel[rel_len] = 0;
}

/* Hard links: (dev, ino) of every multiply linked non-directory copied, with its path. */
struct link { dev_t dev; ino_t ino; char *path; };
static struct link *links;
static size_t nlinks, links_cap;

static const char *link_find(const struct stat *st) {
    if (!nlinks) return NULL;
    for (size_t i = (st->st_ino * 2654435761u) % links_cap;; i = (i + 1) % links_cap) {
        if (!links[i].path) return NULL;
        if (links[i].ino == st->st_ino && links[i].dev == st->st_dev) return links[i].path;
    }
}

static void link_add(const struct stat *st) {
    if ((nlinks + 1) * 2 > links_cap) {
        size_t cap = links_cap ? links_cap * 2 : 64;
        struct link *grown = calloc(cap, sizeof *grown);
        if (!grown) fail("out of memory", ENOMEM);
        for (size_t j = 0; j < links_cap; j++) {
            if (!links[j].path) continue;
            size_t i = (links[j].ino * 2654435761u) % cap;
            while (grown[i].path) i = (i + 1) % cap;
            grown[i] = links[j];
        }
        free(links);
        links = grown;
        links_cap = cap;
    }
    size_t i = (st->st_ino * 2654435761u) % links_cap;
    while (links[i].path) i = (i + 1) % links_cap;
    links[i] = (struct link){st->st_dev, st->st_ino, strdup(rel)};
    if (!links[i].path) fail("out of memory", ENOMEM);
    nlinks++;
}

/* Extended attributes: by descriptor when there is one (fd >= 0), else by the path
 * /proc/self/fd/DIRFD/NAME with the l* calls (symlinks, device nodes, fifos: never opened). */
static void copy_xattrs(int sfd, int dfd, int sdir, const char *sname, int ddir, const char *dname) {
    static char names[XATTR_LIST_MAX_], value[XATTR_SIZE_MAX_];
    char spath[64 + NAME_MAX], dpath[64 + NAME_MAX];
    ssize_t len;
    if (sfd >= 0) {
        len = flistxattr(sfd, names, sizeof names);
    } else {
        snprintf(spath, sizeof spath, "/proc/self/fd/%d/%s", sdir, sname);
        snprintf(dpath, sizeof dpath, "/proc/self/fd/%d/%s", ddir, dname);
        len = llistxattr(spath, names, sizeof names);
    }
    if (len < 0) {
        if (errno == ENOTSUP) return;
        fail("listxattr", errno);
    }
    for (char *k = names; k < names + len; k += strlen(k) + 1) {
        ssize_t n = sfd >= 0 ? fgetxattr(sfd, k, value, sizeof value) : lgetxattr(spath, k, value, sizeof value);
        if (n < 0) {
            if (errno == ENODATA) continue; /* removed meanwhile: nothing to copy */
            fail(k, errno);
        }
        int r = dfd >= 0 ? fsetxattr(dfd, k, value, n, 0) : lsetxattr(dpath, k, value, n, 0);
        if (r < 0 && errno != ENOTSUP) fail(k, errno); /* a namespace the target lacks: as cp -a */
    }
}

static void copy_range(int sfd, int dfd, off_t from, off_t to) {
    while (from < to) {
        size_t want = (size_t)(to - from) < sizeof buf ? (size_t)(to - from) : sizeof buf;
        ssize_t n = pread(sfd, buf, want, from);
        if (n < 0) {
            if (errno == EINTR) continue;
            fail("read", errno);
        }
        if (n == 0) return; /* the file is shorter than its stat said: what is there is copied */
        for (ssize_t done = 0; done < n;) {
            ssize_t w = pwrite(dfd, buf + done, n - done, from + done);
            if (w < 0) {
                if (errno == EINTR) continue;
                fail("write", errno);
            }
            done += w;
        }
        from += n;
    }
}

static void copy_data(int sfd, int dfd, const struct stat *st) {
    if (st->st_size == 0) return;
    if ((off_t)st->st_blocks * 512 >= st->st_size) { /* not sparse: one pass */
        copy_range(sfd, dfd, 0, st->st_size);
        return;
    }
    for (off_t at = 0; at < st->st_size;) { /* sparse: only the data, holes stay holes */
        off_t data = lseek(sfd, at, SEEK_DATA);
        if (data < 0) {
            if (errno == ENXIO) break; /* a hole to the end */
            fail("seek", errno);
        }
        off_t hole = lseek(sfd, data, SEEK_HOLE);
        if (hole < 0) fail("seek", errno);
        copy_range(sfd, dfd, data, hole);
        at = hole;
    }
    if (ftruncate(dfd, st->st_size) < 0) fail("truncate", errno);
}

static void set_times_fd(int fd, const struct stat *st) {
    struct timespec ts[2] = {st->st_atim, st->st_mtim};
    if (futimens(fd, ts) < 0) fail("utimens", errno);
}

/* Owner, then mode (chown clears the set-id bits), then xattrs, then times. A file made with
 * its final permission bits (umask 0) by our own ids needs neither call. */
static void finish_fd(int sfd, int dfd, const struct stat *st, mode_t made) {
    int chowned = st->st_uid != euid || st->st_gid != egid;
    if (chowned && fchown(dfd, st->st_uid, st->st_gid) < 0) fail("chown", errno);
    if ((chowned || (st->st_mode & 07777) != made) && fchmod(dfd, st->st_mode & 07777) < 0) fail("chmod", errno);
    copy_xattrs(sfd, dfd, -1, NULL, -1, NULL);
    set_times_fd(dfd, st);
}

static void copy_dir(int sdir, int ddir, int depth);

/* Entry `sname` of directory `sdir` copied as `dname` in `ddir`. */
static void copy_entry(int sdir, const char *sname, int ddir, const char *dname, int depth) {
    struct stat st;
    if (fstatat(sdir, sname, &st, AT_SYMLINK_NOFOLLOW) < 0) fail("stat", errno);
    if (!S_ISDIR(st.st_mode) && st.st_nlink > 1) {
        const char *first = link_find(&st);
        if (first) {
            if (linkat(dst_root, first, ddir, dname, 0) < 0) fail("link", errno);
            return;
        }
        link_add(&st);
    }
    if (S_ISDIR(st.st_mode)) {
        if (depth >= max_depth) unsupported("deeper than this tool's descriptors allow");
        if (mkdirat(ddir, dname, 0700) < 0) fail("mkdir", errno);
        int s = openat(sdir, sname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (s < 0) fail("open", errno);
        int d = openat(ddir, dname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (d < 0) fail("open", errno);
        copy_dir(s, d, depth + 1);
        finish_fd(s, d, &st, 0700);
        close(s);
        close(d);
    } else if (S_ISREG(st.st_mode)) {
        int s = openat(sdir, sname, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOATIME);
        if (s < 0 && errno == EPERM) s = openat(sdir, sname, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
        if (s < 0) fail("open", errno);
        struct stat opened;
        if (fstat(s, &opened) < 0) fail("stat", errno);
        if (!S_ISREG(opened.st_mode) || opened.st_ino != st.st_ino || opened.st_dev != st.st_dev) {
            errno = 0;
            fail("replaced while being copied", EAGAIN);
        }
        st.st_size = opened.st_size;
        st.st_blocks = opened.st_blocks;
        mode_t made = st.st_mode & 0777;
        int d = openat(ddir, dname, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, made);
        if (d < 0) fail("create", errno); /* writable whatever `made` says: O_CREAT made it */
        copy_data(s, d, &st);
        finish_fd(s, d, &st, made);
        close(s);
        if (close(d) < 0) fail("close", errno); /* a delayed write error (ENOSPC on NFS-like) */
    } else {
        if (S_ISLNK(st.st_mode)) {
            size_t cap = (size_t)st.st_size + 1 > sizeof buf ? (size_t)st.st_size + 1 : sizeof buf;
            char *target = cap > sizeof buf ? malloc(cap) : buf;
            if (!target) fail("out of memory", ENOMEM);
            ssize_t n = readlinkat(sdir, sname, target, cap - 1);
            if (n < 0) fail("readlink", errno);
            target[n] = 0;
            if (symlinkat(target, ddir, dname) < 0) fail("symlink", errno);
            if (target != buf) free(target);
        } else if (mknodat(ddir, dname, (st.st_mode & S_IFMT) | 0600, st.st_rdev) < 0) {
            fail("mknod", errno);
        }
        if (fchownat(ddir, dname, st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW) < 0) fail("chown", errno);
        if (!S_ISLNK(st.st_mode) && fchmodat(ddir, dname, st.st_mode & 07777, 0) < 0) fail("chmod", errno);
        copy_xattrs(-1, -1, sdir, sname, ddir, dname);
        struct timespec ts[2] = {st.st_atim, st.st_mtim};
        if (utimensat(ddir, dname, ts, AT_SYMLINK_NOFOLLOW) < 0) fail("utimens", errno);
    }
}

static void copy_dir(int sdir, int ddir, int depth) {
    int fd = dup(sdir);
    if (fd < 0) fail("dup", errno);
    DIR *dir = fdopendir(fd);
    if (!dir) fail("opendir", errno);
    /* read the whole directory first: its stream's descriptor is closed before the recursion */
    char **names = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(dir);
        if (!e) {
            if (errno) fail("readdir", errno);
            break;
        }
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 32;
            if (!(names = realloc(names, cap * sizeof *names))) fail("out of memory", ENOMEM);
        }
        if (!(names[n++] = strdup(e->d_name))) fail("out of memory", ENOMEM);
    }
    closedir(dir);
    for (size_t i = 0; i < n; i++) {
        size_t old = rel_push(names[i]);
        copy_entry(sdir, names[i], ddir, names[i], depth);
        rel_pop(old);
        free(names[i]);
    }
    free(names);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: rollstack-treecp SRC DST\n");
        return EXIT_USAGE;
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    getrlimit(RLIMIT_NOFILE, &rl);
    max_depth = rl.rlim_cur > 64 ? (int)((rl.rlim_cur - 32) / 2) : 16; /* two fds per level */
    if (max_depth > MAX_DEPTH) max_depth = MAX_DEPTH;
    struct rlimit stack; /* and the stack's room for the recursion (a deeper tree: exit 3) */
    if (getrlimit(RLIMIT_STACK, &stack) == 0 && stack.rlim_cur != RLIM_INFINITY &&
        (rlim_t)max_depth > stack.rlim_cur / STACK_PER_LEVEL)
        max_depth = (int)(stack.rlim_cur / STACK_PER_LEVEL);
    umask(0);
    euid = geteuid();
    egid = getegid();
    rel_cap = 256;
    if (!(rel = calloc(1, rel_cap))) fail("out of memory", ENOMEM);
    /* SRC (a directory, file or anything else; a symlink is copied as one) as DST's name in
     * DST's parent: dirname/basename work on copies (they may modify their argument) */
    char *src_dir = strdup(argv[1]), *src_base = strdup(argv[1]);
    char *dst_dir = strdup(argv[2]), *dst_base = strdup(argv[2]);
    if (!src_dir || !src_base || !dst_dir || !dst_base) fail("out of memory", ENOMEM);
    const char *sname = basename(src_base), *dname = basename(dst_base);
    int s = open(dirname(src_dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (s < 0) fail(argv[1], errno);
    dst_root = open(dirname(dst_dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dst_root < 0) fail(argv[2], errno);
    rel_push(dname);
    copy_entry(s, sname, dst_root, dname, 0);
    return 0;
}
