/*
 * unsynced.c: an LD_PRELOAD shim that records, for the files under one root
 * directory, everything a power loss would undo: data written but not
 * fsynced, files created, renamed or unlinked whose directory was not
 * fsynced. After the process is SIGKILLed, tests/faults/powerloss.py
 * (drop_unsynced) applies the undo journal to the files. What is emulated and
 * what is not is documented there, in the module docstring.
 *
 * Environment (set by powerloss.shim_env):
 *   POWERLOSS_ROOT         files under this directory are tracked
 *   POWERLOSS_UNDO_DIR     undo journals (journal-<pid>-<ns>.bin) and kept
 *                          hard links of replaced/unlinked files go here
 *   POWERLOSS_WRITEBACK_S  optional: changes older than this many seconds
 *                          count as written back by the kernel
 *
 * Journal: a sequence of records, each a fixed header (struct rec), nstr
 * strings (u32 length + bytes) and data (the rest of `total`). `seq` is
 * CLOCK_MONOTONIC nanoseconds, strictly increasing within a process, so the
 * journals of several processes merge into one timeline. A record is written
 * (plain write(), raw syscall) BEFORE the change it describes is made, so a
 * SIGKILL between the two leaves a record of a change that did not happen,
 * which the restore handles (it undoes nothing then).
 *
 * Internal I/O goes through raw syscalls, never through the interposed
 * symbols; a thread-local guard (in_shim) makes any other reentry call through.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef RWF_APPEND
#define RWF_APPEND 0x00000010
#endif
#ifndef RWF_DSYNC
#define RWF_DSYNC 0x00000002
#endif
#ifndef RWF_SYNC
#define RWF_SYNC 0x00000004
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

#define EXPORT __attribute__((visibility("default")))
#define MAGIC 0x50574c53u /* "SLWP" */

enum {
    R_HELLO = 1,   /* v: pid, writeback_ns; strs: root, undo dir */
    R_CHANGE = 2,  /* v: dev, ino, size before, offset; data: pre-image at offset */
    R_SYNC = 3,    /* v: dev, ino, upto, fsync (1) or fdatasync/O_DSYNC (0), size changed since the
                      inode's last sync (1/0): the inode's changes up to seq upto are durable */
    R_DIRSYNC = 4, /* v: dev, ino (of the directory), upto */
    R_SYNCALL = 5, /* v: upto, why (0 sync/syncfs, 1 writeback): everything up to upto is durable */
    R_NEWNAME = 6, /* v: dir dev, dir ino, dev, ino, created (1: O_CREAT made the inode, 0: link);
                      strs: path */
    R_RENAME = 7,  /* v: old dir dev/ino, new dir dev/ino, moved dev/ino, replaced dev/ino (0 0: none);
                      strs: old path, new path, kept link of the replaced file ("" if none) */
    R_UNLINK = 8,  /* v: dir dev, dir ino, dev, ino; strs: path, kept link ("" if none) */
};

struct rec {
    uint32_t magic, type;
    uint64_t total; /* bytes of the record, this header included */
    uint64_t seq;
    uint64_t v[8];
    uint32_t nstr, pad;
};

struct inode {
    uint64_t dev, ino;
    uint64_t synced_size; /* size at its last sync (or when first opened) */
    struct inode *next;
};

struct pend { /* a namespace change not yet made durable by a directory fsync */
    uint64_t ddev, dino, seq;
    char *keep; /* hard link in the undo dir to drop once durable, or NULL */
};

static int active;
static char root[PATH_MAX];
static size_t root_len;
static char undo[PATH_MAX];
static size_t undo_len;
static uint64_t writeback_ns;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int jfd = -1;
static int jfailed;
static uint64_t last_seq;
static uint64_t last_change_seq; /* of the last change (data or name) recorded */
static uint64_t global_synced; /* everything up to here is durable (sync(), writeback) */
static int flusher_started;
static __thread int in_shim;
static char prebuf[1 << 20]; /* pre-image chunk; used under mu */

#define IHASH 4096
static struct inode *ihash[IHASH];
static struct pend *pends;
static size_t npend, cappend;

#define FD_CHUNK 1024
#define FD_CHUNKS 4096
static struct inode **fdtab[FD_CHUNKS];

/* ------------------------------------------------------------ real symbols */
#define DECL_REAL(ret, name, ...) static ret (*real_##name)(__VA_ARGS__)
#define REAL(name)                                                                                             \
    ({                                                                                                         \
        if (!real_##name)                                                                                      \
            real_##name = dlsym(RTLD_NEXT, #name);                                                             \
        real_##name;                                                                                           \
    })

DECL_REAL(int, open, const char *, int, ...);
DECL_REAL(int, open64, const char *, int, ...);
DECL_REAL(int, openat, int, const char *, int, ...);
DECL_REAL(int, openat64, int, const char *, int, ...);
DECL_REAL(int, __open_2, const char *, int);
DECL_REAL(int, __open64_2, const char *, int);
DECL_REAL(int, __openat_2, int, const char *, int);
DECL_REAL(int, __openat64_2, int, const char *, int);
DECL_REAL(ssize_t, write, int, const void *, size_t);
DECL_REAL(ssize_t, pwrite, int, const void *, size_t, off_t);
DECL_REAL(ssize_t, pwrite64, int, const void *, size_t, off64_t);
DECL_REAL(ssize_t, writev, int, const struct iovec *, int);
DECL_REAL(ssize_t, pwritev, int, const struct iovec *, int, off_t);
DECL_REAL(ssize_t, pwritev64, int, const struct iovec *, int, off64_t);
DECL_REAL(ssize_t, pwritev2, int, const struct iovec *, int, off_t, int);
DECL_REAL(ssize_t, pwritev64v2, int, const struct iovec *, int, off64_t, int);
DECL_REAL(int, ftruncate, int, off_t);
DECL_REAL(int, ftruncate64, int, off64_t);
DECL_REAL(int, truncate, const char *, off_t);
DECL_REAL(int, truncate64, const char *, off64_t);
DECL_REAL(int, fallocate, int, int, off_t, off_t);
DECL_REAL(int, fallocate64, int, int, off64_t, off64_t);
DECL_REAL(int, posix_fallocate, int, off_t, off_t);
DECL_REAL(int, posix_fallocate64, int, off64_t, off64_t);
DECL_REAL(ssize_t, sendfile, int, int, off_t *, size_t);
DECL_REAL(ssize_t, sendfile64, int, int, off64_t *, size_t);
DECL_REAL(ssize_t, copy_file_range, int, off64_t *, int, off64_t *, size_t, unsigned int);
DECL_REAL(int, fsync, int);
DECL_REAL(int, fdatasync, int);
DECL_REAL(int, syncfs, int);
DECL_REAL(void, sync, void);
DECL_REAL(int, rename, const char *, const char *);
DECL_REAL(int, renameat, int, const char *, int, const char *);
DECL_REAL(int, renameat2, int, const char *, int, const char *, unsigned int);
DECL_REAL(int, unlink, const char *);
DECL_REAL(int, unlinkat, int, const char *, int);
DECL_REAL(int, remove, const char *);
DECL_REAL(int, link, const char *, const char *);
DECL_REAL(int, linkat, int, const char *, int, const char *, int);
DECL_REAL(int, dup, int);
DECL_REAL(int, dup2, int, int);
DECL_REAL(int, dup3, int, int, int);
DECL_REAL(int, fcntl, int, int, ...);
DECL_REAL(int, fcntl64, int, int, ...);

/* ------------------------------------------------------------ raw helpers */
static int raw_fstat(int fd, struct stat *st) { return (int)syscall(SYS_fstat, fd, st); }
static int raw_lstat(const char *p, struct stat *st)
{
    return (int)syscall(SYS_newfstatat, AT_FDCWD, p, st, AT_SYMLINK_NOFOLLOW);
}
static int raw_stat(const char *p, struct stat *st) { return (int)syscall(SYS_newfstatat, AT_FDCWD, p, st, 0); }
static int raw_open(const char *p, int flags, int mode)
{
    return (int)syscall(SYS_openat, AT_FDCWD, p, flags | O_CLOEXEC, mode);
}
static void raw_close(int fd) { syscall(SYS_close, fd); }
static ssize_t raw_pread(int fd, void *b, size_t n, off_t off) { return syscall(SYS_pread64, fd, b, n, off); }
static int raw_getfl(int fd) { return (int)syscall(SYS_fcntl, fd, F_GETFL); }
static off_t raw_lseek_cur(int fd) { return (off_t)syscall(SYS_lseek, fd, 0, SEEK_CUR); }
static int raw_unlink(const char *p) { return (int)syscall(SYS_unlinkat, AT_FDCWD, p, 0); }
static int raw_link(const char *from, const char *to)
{
    return (int)syscall(SYS_linkat, AT_FDCWD, from, AT_FDCWD, to, 0);
}
static ssize_t raw_readlink(const char *p, char *buf, size_t n)
{
    return syscall(SYS_readlinkat, AT_FDCWD, p, buf, n);
}

static void warn(const char *msg)
{
    char buf[512];
    int n = snprintf(buf, sizeof buf, "powerloss shim [%d]: %s\n", (int)getpid(), msg);
    if (n > 0)
        syscall(SYS_write, 2, buf, (size_t)(n < (int)sizeof buf ? n : (int)sizeof buf - 1));
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Under mu: a new sequence number (monotonic ns, strictly increasing). */
static uint64_t next_seq(void)
{
    uint64_t t = now_ns();
    if (t <= last_seq)
        t = last_seq + 1;
    last_seq = t;
    return t;
}

static int write_all_v(int fd, struct iovec *iov, int cnt)
{
    while (cnt > 0) {
        ssize_t r = syscall(SYS_writev, fd, iov, cnt);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        while (cnt > 0 && (size_t)r >= iov->iov_len) {
            r -= (ssize_t)iov->iov_len;
            iov++;
            cnt--;
        }
        if (cnt > 0) {
            iov->iov_base = (char *)iov->iov_base + r;
            iov->iov_len -= (size_t)r;
        }
    }
    return 0;
}

/* ------------------------------------------------------------ journal */
static void emit(uint32_t type, uint64_t seq, const uint64_t *v, int nv, const char **strs, int nstr,
                 const void *data, size_t dlen);
static void *flusher(void *arg);

/* Under mu. */
static int journal(void)
{
    if (jfd >= 0)
        return jfd;
    if (jfailed)
        return -1;
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%.3900s/journal-%d-%llu.bin", undo, (int)getpid(), (unsigned long long)now_ns());
    jfd = raw_open(p, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (jfd < 0) {
        jfailed = 1;
        warn("cannot create the undo journal: changes are NOT recorded");
        return -1;
    }
    uint64_t v[2] = {(uint64_t)getpid(), writeback_ns};
    const char *s[2] = {root, undo};
    emit(R_HELLO, next_seq(), v, 2, s, 2, NULL, 0);
    if (writeback_ns && !flusher_started) {
        pthread_t t;
        pthread_attr_t a;
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old); /* the thread inherits: it takes no signals */
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &a, flusher, NULL) == 0)
            flusher_started = 1;
        else
            warn("cannot start the writeback thread");
        pthread_attr_destroy(&a);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    return jfd;
}

/* Under mu. */
static void emit(uint32_t type, uint64_t seq, const uint64_t *v, int nv, const char **strs, int nstr,
                 const void *data, size_t dlen)
{
    int fd = journal();
    if (fd < 0)
        return;
    struct rec h;
    memset(&h, 0, sizeof h);
    h.magic = MAGIC;
    h.type = type;
    h.seq = seq;
    for (int i = 0; i < nv && i < 8; i++)
        h.v[i] = v[i];
    h.nstr = (uint32_t)nstr;
    struct iovec iov[2 + 2 * 3 + 1];
    uint32_t lens[3];
    int cnt = 0;
    uint64_t total = sizeof h;
    iov[cnt].iov_base = &h;
    iov[cnt++].iov_len = sizeof h;
    for (int i = 0; i < nstr && i < 3; i++) {
        lens[i] = (uint32_t)strlen(strs[i]);
        iov[cnt].iov_base = &lens[i];
        iov[cnt++].iov_len = 4;
        iov[cnt].iov_base = (void *)strs[i];
        iov[cnt++].iov_len = lens[i];
        total += 4 + lens[i];
    }
    if (dlen) {
        iov[cnt].iov_base = (void *)data;
        iov[cnt++].iov_len = dlen;
        total += dlen;
    }
    h.total = total;
    if (type == R_CHANGE || type == R_NEWNAME || type == R_RENAME || type == R_UNLINK)
        last_change_seq = seq;
    if (write_all_v(fd, iov, cnt) != 0 && !jfailed) {
        jfailed = 1;
        warn("writing the undo journal failed: the emulation is incomplete from here on");
    }
}

/* ------------------------------------------------------------ tables */
static struct inode *fd_get(int fd)
{
    if (fd < 0 || fd >= FD_CHUNK * FD_CHUNKS)
        return NULL;
    struct inode **c = __atomic_load_n(&fdtab[fd / FD_CHUNK], __ATOMIC_ACQUIRE);
    if (!c)
        return NULL;
    return __atomic_load_n(&c[fd % FD_CHUNK], __ATOMIC_ACQUIRE);
}

static void fd_clear(int fd)
{
    if (fd < 0 || fd >= FD_CHUNK * FD_CHUNKS)
        return;
    struct inode **c = __atomic_load_n(&fdtab[fd / FD_CHUNK], __ATOMIC_ACQUIRE);
    if (c)
        __atomic_store_n(&c[fd % FD_CHUNK], NULL, __ATOMIC_RELEASE);
}

/* Under mu. */
static void fd_put(int fd, struct inode *in)
{
    if (fd < 0 || fd >= FD_CHUNK * FD_CHUNKS)
        return;
    struct inode **c = fdtab[fd / FD_CHUNK];
    if (!c) {
        if (!in)
            return;
        c = calloc(FD_CHUNK, sizeof *c);
        if (!c)
            return;
        __atomic_store_n(&fdtab[fd / FD_CHUNK], c, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&c[fd % FD_CHUNK], in, __ATOMIC_RELEASE);
}

/* Under mu. */
static struct inode *inode_find(uint64_t dev, uint64_t ino)
{
    for (struct inode *in = ihash[(ino ^ dev) % IHASH]; in; in = in->next)
        if (in->dev == dev && in->ino == ino)
            return in;
    return NULL;
}

/* Under mu. size: the file's size now, taken as durable when the inode is new to us. */
static struct inode *inode_get(uint64_t dev, uint64_t ino, uint64_t size)
{
    struct inode *in = inode_find(dev, ino);
    if (in)
        return in;
    in = calloc(1, sizeof *in);
    if (!in)
        return NULL;
    in->dev = dev;
    in->ino = ino;
    in->synced_size = size;
    in->next = ihash[(ino ^ dev) % IHASH];
    ihash[(ino ^ dev) % IHASH] = in;
    return in;
}

/* Under mu. */
static void pend_add(uint64_t ddev, uint64_t dino, uint64_t seq, const char *keep)
{
    if (npend == cappend) {
        size_t n = cappend ? cappend * 2 : 64;
        struct pend *p = realloc(pends, n * sizeof *p);
        if (!p)
            return;
        pends = p;
        cappend = n;
    }
    pends[npend].ddev = ddev;
    pends[npend].dino = dino;
    pends[npend].seq = seq;
    pends[npend].keep = keep && *keep ? strdup(keep) : NULL;
    npend++;
}

/* Under mu: namespace changes now durable (in directory ddev/dino, or anywhere
 * when all) no longer need their kept links. */
static void pend_settle(int all, uint64_t ddev, uint64_t dino, uint64_t upto)
{
    size_t j = 0;
    for (size_t i = 0; i < npend; i++) {
        struct pend *p = &pends[i];
        if (p->seq <= upto && (all || (p->ddev == ddev && p->dino == dino))) {
            if (p->keep) {
                raw_unlink(p->keep);
                free(p->keep);
            }
            continue;
        }
        pends[j++] = *p;
    }
    npend = j;
}

/* ------------------------------------------------------------ paths */
static int under(const char *full, const char *dir, size_t len)
{
    return strncmp(full, dir, len) == 0 && (full[len] == '/' || full[len] == 0);
}

/* The absolute path of `p` (relative to dirfd) with its directory resolved
 * (symlinks, "..") but not its last component. 0 if it names an entry under
 * root (not in the undo dir), with the directory's dev/ino; -1 otherwise. */
static int resolve(int dirfd, const char *p, char *full, uint64_t *pdev, uint64_t *pino)
{
    char buf[PATH_MAX * 2];
    size_t n;
    if (!p || !(n = strlen(p)) || n >= PATH_MAX)
        return -1;
    if (p[0] == '/') {
        memcpy(buf, p, n + 1);
    } else {
        char base[PATH_MAX];
        if (dirfd == AT_FDCWD) {
            if (syscall(SYS_getcwd, base, sizeof base) < 0)
                return -1;
        } else {
            char lk[64];
            snprintf(lk, sizeof lk, "/proc/self/fd/%d", dirfd);
            ssize_t r = raw_readlink(lk, base, sizeof base - 1);
            if (r <= 0)
                return -1;
            base[r] = 0;
        }
        if ((size_t)snprintf(buf, sizeof buf, "%s/%s", base, p) >= sizeof buf)
            return -1;
    }
    size_t len = strlen(buf);
    if (len > 1 && buf[len - 1] == '/')
        return -1; /* a trailing slash: a directory */
    char *slash = strrchr(buf, '/');
    const char *name = slash + 1;
    if (!*name || !strcmp(name, ".") || !strcmp(name, ".."))
        return -1;
    char real[PATH_MAX];
    if (slash == buf) {
        strcpy(real, "/");
    } else {
        *slash = 0;
        if (!realpath(buf, real))
            return -1;
    }
    if (!under(real, root, root_len))
        return -1;
    if ((size_t)snprintf(full, PATH_MAX, "%s/%s", strcmp(real, "/") ? real : "", name) >= PATH_MAX)
        return -1;
    if (under(full, undo, undo_len))
        return -1;
    if (pdev) {
        struct stat st;
        if (raw_stat(real, &st) != 0)
            return -1;
        *pdev = st.st_dev;
        *pino = st.st_ino;
    }
    return 0;
}

/* Is the file open as fd (a directory or a file nobody tracked) under root? */
static int fd_under_root(int fd)
{
    char lk[64], path[PATH_MAX];
    snprintf(lk, sizeof lk, "/proc/self/fd/%d", fd);
    ssize_t r = raw_readlink(lk, path, sizeof path - 1);
    if (r <= 0)
        return 0;
    path[r] = 0;
    return under(path, root, root_len) && !under(path, undo, undo_len);
}

/* ------------------------------------------------------------ changes */
/* Under mu: bytes [pos, pos+len) of the inode (open as fd, else at path) are
 * about to change; the file is `size` bytes long now. Records the size and the
 * pre-image of the bytes below it, in chunks. */
static void record_change(int fd, const char *path, struct inode *in, uint64_t size, uint64_t pos, uint64_t len)
{
    uint64_t end = pos + len < pos ? UINT64_MAX : pos + len;
    uint64_t pre_end = end < size ? end : size;
    uint64_t v[4] = {in->dev, in->ino, size, pos};
    if (pos >= pre_end) {
        emit(R_CHANGE, next_seq(), v, 4, NULL, 0, NULL, 0);
        return;
    }
    int rfd;
    if (fd >= 0) {
        char lk[64];
        snprintf(lk, sizeof lk, "/proc/self/fd/%d", fd);
        rfd = raw_open(lk, O_RDONLY, 0);
    } else {
        rfd = raw_open(path, O_RDONLY, 0);
    }
    if (rfd < 0) {
        warn("cannot read a pre-image: an overwrite will not be undone");
        emit(R_CHANGE, next_seq(), v, 4, NULL, 0, NULL, 0);
        return;
    }
    uint64_t off = pos;
    int wrote = 0;
    while (off < pre_end) {
        size_t n = pre_end - off < sizeof prebuf ? (size_t)(pre_end - off) : sizeof prebuf;
        ssize_t r = raw_pread(rfd, prebuf, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        v[3] = off;
        emit(R_CHANGE, next_seq(), v, 4, NULL, 0, prebuf, (size_t)r);
        wrote = 1;
        off += (uint64_t)r;
    }
    if (!wrote)
        emit(R_CHANGE, next_seq(), v, 4, NULL, 0, NULL, 0);
    raw_close(rfd);
}

enum { K_WRITE, K_TRUNC, K_RANGE, K_TAIL };
#define AT_CUR UINT64_MAX

struct ctx {
    struct inode *in;
    int fl;
    int rwf_sync;
};

/* Before a call that changes the file open as fd. Returns 0 with mu held if
 * fd is tracked (the change is recorded), -1 (mu not held) to call through. */
static int begin_change(int fd, int kind, uint64_t at, uint64_t len, int append, struct ctx *c)
{
    if (!active || in_shim)
        return -1;
    struct inode *in = fd_get(fd);
    if (!in)
        return -1;
    in_shim = 1;
    pthread_mutex_lock(&mu);
    struct stat st;
    if (raw_fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_dev != in->dev ||
        (uint64_t)st.st_ino != in->ino) {
        fd_clear(fd); /* closed and reused for something else */
        pthread_mutex_unlock(&mu);
        in_shim = 0;
        return -1;
    }
    int fl = raw_getfl(fd);
    uint64_t size = (uint64_t)st.st_size;
    switch (kind) {
    case K_WRITE: {
        uint64_t pos;
        if ((fl >= 0 && (fl & O_APPEND)) || append)
            pos = size; /* Linux appends even for pwrite on an O_APPEND fd */
        else if (at == AT_CUR)
            pos = (uint64_t)raw_lseek_cur(fd);
        else
            pos = at;
        record_change(fd, NULL, in, size, pos, len);
        break;
    }
    case K_TRUNC: /* new size `at` */
        record_change(fd, NULL, in, size, at, size > at ? size - at : 0);
        break;
    case K_RANGE: /* bytes [at, at+len) change */
        record_change(fd, NULL, in, size, at, len);
        break;
    case K_TAIL: /* everything from `at` on moves */
        record_change(fd, NULL, in, size, at, size > at ? size - at : 0);
        break;
    }
    c->in = in;
    c->fl = fl < 0 ? 0 : fl;
    c->rwf_sync = 0;
    return 0;
}

static void end_change(struct ctx *c, int ok)
{
    if (ok && ((c->fl & (O_SYNC | O_DSYNC)) || c->rwf_sync)) {
        uint64_t s = next_seq();
        uint64_t v[5] = {c->in->dev, c->in->ino, s, 0, 1};
        emit(R_SYNC, s, v, 5, NULL, 0, NULL, 0);
    }
    pthread_mutex_unlock(&mu);
    in_shim = 0;
}

static uint64_t iov_len(const struct iovec *iov, int cnt)
{
    uint64_t n = 0;
    for (int i = 0; i < cnt; i++)
        n += iov[i].iov_len;
    return n;
}

/* ------------------------------------------------------------ writes */
EXPORT ssize_t write(int fd, const void *buf, size_t n)
{
    struct ctx c;
    if (begin_change(fd, K_WRITE, AT_CUR, n, 0, &c) != 0)
        return REAL(write)(fd, buf, n);
    ssize_t r = REAL(write)(fd, buf, n);
    int e = errno;
    end_change(&c, r >= 0);
    errno = e;
    return r;
}

EXPORT ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
    struct ctx c;
    if (begin_change(fd, K_WRITE, (uint64_t)off, n, 0, &c) != 0)
        return REAL(pwrite)(fd, buf, n, off);
    ssize_t r = REAL(pwrite)(fd, buf, n, off);
    int e = errno;
    end_change(&c, r >= 0);
    errno = e;
    return r;
}

EXPORT ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t off)
{
    struct ctx c;
    if (begin_change(fd, K_WRITE, (uint64_t)off, n, 0, &c) != 0)
        return REAL(pwrite64)(fd, buf, n, off);
    ssize_t r = REAL(pwrite64)(fd, buf, n, off);
    int e = errno;
    end_change(&c, r >= 0);
    errno = e;
    return r;
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
    struct ctx c;
    if (begin_change(fd, K_WRITE, AT_CUR, iov_len(iov, cnt), 0, &c) != 0)
        return REAL(writev)(fd, iov, cnt);
    ssize_t r = REAL(writev)(fd, iov, cnt);
    int e = errno;
    end_change(&c, r >= 0);
    errno = e;
    return r;
}

EXPORT ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off)
{
    struct ctx c;
    if (begin_change(fd, K_WRITE, (uint64_t)off, iov_len(iov, cnt), 0, &c) != 0)
        return REAL(pwritev)(fd, iov, cnt, off);
    ssize_t r = REAL(pwritev)(fd, iov, cnt, off);
    int e = errno;
    end_change(&c, r >= 0);
    errno = e;
    return r;
}

EXPORT ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off64_t off)
{
    struct ctx c;
    if (begin_change(fd, K_WRITE, (uint64_t)off, iov_len(iov, cnt), 0, &c) != 0)
        return REAL(pwritev64)(fd, iov, cnt, off);
    ssize_t r = REAL(pwritev64)(fd, iov, cnt, off);
    int e = errno;
    end_change(&c, r >= 0);
    errno = e;
    return r;
}

/* pwritev2: offset -1 means the file position; RWF_APPEND appends. */
EXPORT ssize_t pwritev2(int fd, const struct iovec *iov, int cnt, off_t off, int flags)
{
    struct ctx c;
    uint64_t at = off == -1 ? AT_CUR : (uint64_t)off;
    if (begin_change(fd, K_WRITE, at, iov_len(iov, cnt), flags & RWF_APPEND, &c) != 0)
        return REAL(pwritev2)(fd, iov, cnt, off, flags);
    c.rwf_sync = flags & (RWF_DSYNC | RWF_SYNC);
    ssize_t r = REAL(pwritev2)(fd, iov, cnt, off, flags);
    int e = errno;
    end_change(&c, r >= 0);
    errno = e;
    return r;
}

EXPORT ssize_t pwritev64v2(int fd, const struct iovec *iov, int cnt, off64_t off, int flags)
{
    struct ctx c;
    uint64_t at = off == -1 ? AT_CUR : (uint64_t)off;
    if (begin_change(fd, K_WRITE, at, iov_len(iov, cnt), flags & RWF_APPEND, &c) != 0)
        return REAL(pwritev64v2)(fd, iov, cnt, off, flags);
    c.rwf_sync = flags & (RWF_DSYNC | RWF_SYNC);
    ssize_t r = REAL(pwritev64v2)(fd, iov, cnt, off, flags);
    int e = errno;
    end_change(&c, r >= 0);
    errno = e;
    return r;
}

EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t n)
{
    struct ctx c;
    if (begin_change(out, K_WRITE, AT_CUR, n, 0, &c) != 0)
        return REAL(sendfile)(out, in, off, n);
    ssize_t r = REAL(sendfile)(out, in, off, n);
    int e = errno;
    end_change(&c, r >= 0);
    errno = e;
    return r;
}

EXPORT ssize_t sendfile64(int out, int in, off64_t *off, size_t n)
{
    struct ctx c;
    if (begin_change(out, K_WRITE, AT_CUR, n, 0, &c) != 0)
        return REAL(sendfile64)(out, in, off, n);
    ssize_t r = REAL(sendfile64)(out, in, off, n);
    int e = errno;
    end_change(&c, r >= 0);
    errno = e;
    return r;
}

EXPORT ssize_t copy_file_range(int in, off64_t *off_in, int out, off64_t *off_out, size_t n, unsigned int flags)
{
    struct ctx c;
    uint64_t at = off_out ? (uint64_t)*off_out : AT_CUR;
    if (begin_change(out, K_WRITE, at, n, 0, &c) != 0)
        return REAL(copy_file_range)(in, off_in, out, off_out, n, flags);
    ssize_t r = REAL(copy_file_range)(in, off_in, out, off_out, n, flags);
    int e = errno;
    end_change(&c, r >= 0);
    errno = e;
    return r;
}

EXPORT int ftruncate(int fd, off_t len)
{
    struct ctx c;
    if (len < 0 || begin_change(fd, K_TRUNC, (uint64_t)len, 0, 0, &c) != 0)
        return REAL(ftruncate)(fd, len);
    int r = REAL(ftruncate)(fd, len);
    int e = errno;
    end_change(&c, r == 0);
    errno = e;
    return r;
}

EXPORT int ftruncate64(int fd, off64_t len)
{
    struct ctx c;
    if (len < 0 || begin_change(fd, K_TRUNC, (uint64_t)len, 0, 0, &c) != 0)
        return REAL(ftruncate64)(fd, len);
    int r = REAL(ftruncate64)(fd, len);
    int e = errno;
    end_change(&c, r == 0);
    errno = e;
    return r;
}

static int falloc_kind(int mode, uint64_t *len)
{
    if (mode & (FALLOC_FL_COLLAPSE_RANGE | FALLOC_FL_INSERT_RANGE))
        return K_TAIL;
    if (mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE))
        return K_RANGE;
    *len = 0; /* plain allocation: bytes stay, the size may grow */
    return K_RANGE;
}

EXPORT int fallocate(int fd, int mode, off_t off, off_t len)
{
    struct ctx c;
    uint64_t n = (uint64_t)len;
    int kind = falloc_kind(mode, &n);
    if (off < 0 || len < 0 || begin_change(fd, kind, (uint64_t)off, n, 0, &c) != 0)
        return REAL(fallocate)(fd, mode, off, len);
    int r = REAL(fallocate)(fd, mode, off, len);
    int e = errno;
    end_change(&c, r == 0);
    errno = e;
    return r;
}

EXPORT int fallocate64(int fd, int mode, off64_t off, off64_t len)
{
    struct ctx c;
    uint64_t n = (uint64_t)len;
    int kind = falloc_kind(mode, &n);
    if (off < 0 || len < 0 || begin_change(fd, kind, (uint64_t)off, n, 0, &c) != 0)
        return REAL(fallocate64)(fd, mode, off, len);
    int r = REAL(fallocate64)(fd, mode, off, len);
    int e = errno;
    end_change(&c, r == 0);
    errno = e;
    return r;
}

EXPORT int posix_fallocate(int fd, off_t off, off_t len)
{
    struct ctx c;
    if (off < 0 || len < 0 || begin_change(fd, K_RANGE, (uint64_t)off, 0, 0, &c) != 0)
        return REAL(posix_fallocate)(fd, off, len);
    int r = REAL(posix_fallocate)(fd, off, len); /* returns an error number */
    end_change(&c, r == 0);
    return r;
}

EXPORT int posix_fallocate64(int fd, off64_t off, off64_t len)
{
    struct ctx c;
    if (off < 0 || len < 0 || begin_change(fd, K_RANGE, (uint64_t)off, 0, 0, &c) != 0)
        return REAL(posix_fallocate64)(fd, off, len);
    int r = REAL(posix_fallocate64)(fd, off, len);
    end_change(&c, r == 0);
    return r;
}

/* truncate(path): the inode need not be open. */
static int do_truncate(const char *p, off_t len, int is64)
{
#define CALL_TRUNC() (is64 ? REAL(truncate64)(p, len) : REAL(truncate)(p, len))
    char full[PATH_MAX];
    if (!active || in_shim || len < 0)
        return CALL_TRUNC();
    in_shim = 1;
    if (resolve(AT_FDCWD, p, full, NULL, NULL) != 0) {
        in_shim = 0;
        return CALL_TRUNC();
    }
    pthread_mutex_lock(&mu);
    struct stat st;
    struct inode *in = NULL;
    if (raw_stat(full, &st) == 0 && S_ISREG(st.st_mode) &&
        (in = inode_get(st.st_dev, st.st_ino, (uint64_t)st.st_size)))
        record_change(-1, full, in, (uint64_t)st.st_size, (uint64_t)len,
                      (uint64_t)st.st_size > (uint64_t)len ? (uint64_t)st.st_size - (uint64_t)len : 0);
    int r = CALL_TRUNC();
    int e = errno;
    pthread_mutex_unlock(&mu);
    in_shim = 0;
    errno = e;
    return r;
#undef CALL_TRUNC
}

EXPORT int truncate(const char *p, off_t len) { return do_truncate(p, len, 0); }
EXPORT int truncate64(const char *p, off64_t len) { return do_truncate(p, len, 1); }

/* ------------------------------------------------------------ syncs */
static int do_sync(int fd, int data)
{
#define CALL_SYNC() (data ? REAL(fdatasync)(fd) : REAL(fsync)(fd))
    if (!active || in_shim)
        return CALL_SYNC();
    struct stat st;
    if (raw_fstat(fd, &st) != 0)
        return CALL_SYNC();
    int dir = S_ISDIR(st.st_mode);
    if (!dir && !S_ISREG(st.st_mode))
        return CALL_SYNC();
    in_shim = 1;
    pthread_mutex_lock(&mu);
    int known = !dir && inode_find(st.st_dev, st.st_ino) != NULL;
    pthread_mutex_unlock(&mu);
    if (!known && !fd_under_root(fd)) {
        in_shim = 0;
        return CALL_SYNC();
    }
    pthread_mutex_lock(&mu);
    uint64_t upto = next_seq(); /* every record so far is below: the sync covers it */
    if (raw_fstat(fd, &st) != 0) /* the size as the sync starts */
        st.st_size = 0;
    pthread_mutex_unlock(&mu);
    int r = CALL_SYNC();
    int e = errno;
    if (r == 0) {
        pthread_mutex_lock(&mu);
        if (dir) {
            uint64_t v[3] = {st.st_dev, st.st_ino, upto};
            emit(R_DIRSYNC, next_seq(), v, 3, NULL, 0, NULL, 0);
            pend_settle(0, st.st_dev, st.st_ino, upto);
        } else {
            struct inode *in = inode_get(st.st_dev, st.st_ino, (uint64_t)st.st_size);
            int grew = !in || in->synced_size != (uint64_t)st.st_size;
            if (in)
                in->synced_size = (uint64_t)st.st_size;
            uint64_t v[5] = {st.st_dev, st.st_ino, upto, (uint64_t)!data, (uint64_t)grew};
            emit(R_SYNC, next_seq(), v, 5, NULL, 0, NULL, 0);
        }
        pthread_mutex_unlock(&mu);
    }
    in_shim = 0;
    errno = e;
    return r;
#undef CALL_SYNC
}

EXPORT int fsync(int fd) { return do_sync(fd, 0); }
EXPORT int fdatasync(int fd) { return do_sync(fd, 1); }

static void sync_all(uint64_t upto, uint64_t why)
{
    uint64_t v[2] = {upto, why};
    emit(R_SYNCALL, next_seq(), v, 2, NULL, 0, NULL, 0);
    if (upto > global_synced)
        global_synced = upto;
    pend_settle(1, 0, 0, upto);
}

EXPORT int syncfs(int fd)
{
    if (!active || in_shim)
        return REAL(syncfs)(fd);
    in_shim = 1;
    pthread_mutex_lock(&mu);
    uint64_t upto = next_seq();
    pthread_mutex_unlock(&mu);
    int r = REAL(syncfs)(fd);
    int e = errno;
    if (r == 0) {
        pthread_mutex_lock(&mu);
        sync_all(upto, 0);
        pthread_mutex_unlock(&mu);
    }
    in_shim = 0;
    errno = e;
    return r;
}

EXPORT void sync(void)
{
    if (!active || in_shim) {
        REAL(sync)();
        return;
    }
    in_shim = 1;
    pthread_mutex_lock(&mu);
    uint64_t upto = next_seq();
    pthread_mutex_unlock(&mu);
    REAL(sync)();
    pthread_mutex_lock(&mu);
    sync_all(upto, 0);
    pthread_mutex_unlock(&mu);
    in_shim = 0;
}

/* The kernel's periodic writeback: what is older than writeback_ns is on disk. */
static void *flusher(void *arg)
{
    (void)arg;
    uint64_t tick = writeback_ns / 5;
    if (tick < 10000000ull)
        tick = 10000000ull;
    if (tick > 100000000ull)
        tick = 100000000ull;
    for (;;) {
        struct timespec ts = {(time_t)(tick / 1000000000ull), (long)(tick % 1000000000ull)};
        nanosleep(&ts, NULL);
        in_shim = 1;
        pthread_mutex_lock(&mu);
        uint64_t now = now_ns();
        uint64_t upto = now > writeback_ns ? now - writeback_ns : 0;
        if (upto > global_synced && last_change_seq > global_synced && jfd >= 0)
            sync_all(upto, 1);
        pthread_mutex_unlock(&mu);
        in_shim = 0;
    }
    return NULL;
}

/* ------------------------------------------------------------ opens */
enum { OP_OPEN, OP_OPEN64, OP_OPENAT, OP_OPENAT64, OP_OPEN2, OP_OPEN64_2, OP_OPENAT2, OP_OPENAT64_2 };

static int call_open(int k, int dirfd, const char *p, int flags, mode_t mode)
{
    switch (k) {
    case OP_OPEN:
        return REAL(open)(p, flags, mode);
    case OP_OPEN64:
        return REAL(open64)(p, flags, mode);
    case OP_OPENAT:
        return REAL(openat)(dirfd, p, flags, mode);
    case OP_OPENAT64:
        return REAL(openat64)(dirfd, p, flags, mode);
    case OP_OPEN2:
        return REAL(__open_2)(p, flags);
    case OP_OPEN64_2:
        return REAL(__open64_2)(p, flags);
    case OP_OPENAT2:
        return REAL(__openat_2)(dirfd, p, flags);
    default:
        return REAL(__openat64_2)(dirfd, p, flags);
    }
}

static int do_open(int k, int dirfd, const char *p, int flags, mode_t mode)
{
    char full[PATH_MAX];
    uint64_t pdev = 0, pino = 0;
    if (!active || in_shim || (flags & O_PATH) || (flags & O_DIRECTORY) ||
        resolve(dirfd, p, full, &pdev, &pino) != 0) {
        int fd = call_open(k, dirfd, p, flags, mode);
        if (fd >= 0 && fd_get(fd)) {
            int e = errno;
            fd_clear(fd); /* a number reused: whatever it tracked was closed */
            errno = e;
        }
        return fd;
    }
    in_shim = 1;
    pthread_mutex_lock(&mu);
    struct stat st0;
    int existed = raw_lstat(full, &st0) == 0;
    if (existed && !S_ISREG(st0.st_mode) && !S_ISLNK(st0.st_mode)) {
        /* a directory, FIFO, device: not tracked (and a FIFO's open may block) */
        pthread_mutex_unlock(&mu);
        int fd = call_open(k, dirfd, p, flags, mode);
        int e = errno;
        if (fd >= 0)
            fd_clear(fd);
        in_shim = 0;
        errno = e;
        return fd;
    }
    int trunc = (flags & O_TRUNC) && existed && S_ISREG(st0.st_mode) && st0.st_size > 0 &&
                (flags & O_ACCMODE) != O_RDONLY;
    int fd = call_open(k, dirfd, p, trunc ? flags & ~O_TRUNC : flags, mode);
    int e = errno;
    struct stat st;
    if (fd >= 0 && raw_fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        struct inode *in = inode_get(st.st_dev, st.st_ino, (uint64_t)st.st_size);
        if (in && !existed && (flags & O_CREAT)) {
            in->synced_size = 0; /* a new file (maybe a reused inode number) */
            uint64_t v[5] = {pdev, pino, st.st_dev, st.st_ino, 1};
            uint64_t seq = next_seq();
            const char *s[1] = {full};
            emit(R_NEWNAME, seq, v, 5, s, 1, NULL, 0);
            pend_add(pdev, pino, seq, NULL);
        }
        if (in && trunc) {
            record_change(fd, NULL, in, (uint64_t)st.st_size, 0, (uint64_t)st.st_size);
            if (syscall(SYS_ftruncate, fd, 0) != 0) { /* what O_TRUNC would have done */
                e = errno;
                raw_close(fd);
                fd = -1;
            }
        }
        if (fd >= 0)
            fd_put(fd, in);
    } else if (fd >= 0) {
        fd_clear(fd);
    }
    pthread_mutex_unlock(&mu);
    in_shim = 0;
    errno = e;
    return fd;
}

#define MODE_ARG(flags, mode)                                                                                  \
    do {                                                                                                       \
        if ((flags) & (O_CREAT | __O_TMPFILE)) {                                                               \
            va_list ap;                                                                                        \
            va_start(ap, flags);                                                                               \
            mode = (mode_t)va_arg(ap, int);                                                                    \
            va_end(ap);                                                                                        \
        }                                                                                                      \
    } while (0)

EXPORT int open(const char *p, int flags, ...)
{
    mode_t mode = 0;
    MODE_ARG(flags, mode);
    return do_open(OP_OPEN, AT_FDCWD, p, flags, mode);
}

EXPORT int open64(const char *p, int flags, ...)
{
    mode_t mode = 0;
    MODE_ARG(flags, mode);
    return do_open(OP_OPEN64, AT_FDCWD, p, flags, mode);
}

EXPORT int openat(int dirfd, const char *p, int flags, ...)
{
    mode_t mode = 0;
    MODE_ARG(flags, mode);
    return do_open(OP_OPENAT, dirfd, p, flags, mode);
}

EXPORT int openat64(int dirfd, const char *p, int flags, ...)
{
    mode_t mode = 0;
    MODE_ARG(flags, mode);
    return do_open(OP_OPENAT64, dirfd, p, flags, mode);
}

EXPORT int __open_2(const char *p, int flags) { return do_open(OP_OPEN2, AT_FDCWD, p, flags, 0); }
EXPORT int __open64_2(const char *p, int flags) { return do_open(OP_OPEN64_2, AT_FDCWD, p, flags, 0); }
EXPORT int __openat_2(int dirfd, const char *p, int flags) { return do_open(OP_OPENAT2, dirfd, p, flags, 0); }
EXPORT int __openat64_2(int dirfd, const char *p, int flags)
{
    return do_open(OP_OPENAT64_2, dirfd, p, flags, 0);
}

EXPORT int creat(const char *p, mode_t mode)
{
    return do_open(OP_OPEN, AT_FDCWD, p, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

EXPORT int creat64(const char *p, mode_t mode)
{
    return do_open(OP_OPEN64, AT_FDCWD, p, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

/* ------------------------------------------------------------ dup */
static void fd_copy(int from, int to)
{
    struct inode *in = fd_get(from);
    if (in) {
        int e = errno;
        pthread_mutex_lock(&mu);
        fd_put(to, in);
        pthread_mutex_unlock(&mu);
        errno = e;
    } else if (fd_get(to)) {
        fd_clear(to);
    }
}

EXPORT int dup(int fd)
{
    int r = REAL(dup)(fd);
    if (r >= 0 && active)
        fd_copy(fd, r);
    return r;
}

EXPORT int dup2(int fd, int to)
{
    int r = REAL(dup2)(fd, to);
    if (r >= 0 && active && fd != to)
        fd_copy(fd, r);
    return r;
}

EXPORT int dup3(int fd, int to, int flags)
{
    int r = REAL(dup3)(fd, to, flags);
    if (r >= 0 && active)
        fd_copy(fd, r);
    return r;
}

/* fcntl is variadic; like glibc, pass the one optional argument on as a pointer. */
EXPORT int fcntl(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    int r = REAL(fcntl)(fd, cmd, arg);
    if (r >= 0 && active && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC))
        fd_copy(fd, r);
    return r;
}

EXPORT int fcntl64(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    int r = REAL(fcntl64)(fd, cmd, arg);
    if (r >= 0 && active && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC))
        fd_copy(fd, r);
    return r;
}

/* ------------------------------------------------------------ namespace */
/* Under mu: a hard link to `path` in the undo dir, kept until the change that
 * removes the name is durable. "" if it cannot be made. */
static void keep_link(const char *path, uint64_t seq, char *keep)
{
    snprintf(keep, PATH_MAX, "%.3900s/keep-%d-%llu", undo, (int)getpid(), (unsigned long long)seq);
    if (raw_link(path, keep) != 0) {
        warn("cannot hard-link a replaced/unlinked file into the undo dir (another filesystem?): "
             "that name will not come back");
        keep[0] = 0;
    }
}

enum { RN_RENAME, RN_RENAMEAT, RN_RENAMEAT2 };

static int do_rename(int k, int od, const char *op, int nd, const char *np, unsigned int flags)
{
#define CALL_RENAME()                                                                                          \
    (k == RN_RENAME     ? REAL(rename)(op, np)                                                                 \
     : k == RN_RENAMEAT ? REAL(renameat)(od, op, nd, np)                                                       \
                        : REAL(renameat2)(od, op, nd, np, flags))
    char ofull[PATH_MAX], nfull[PATH_MAX], keep[PATH_MAX];
    uint64_t odev, oino, ndev, nino;
    if (!active || in_shim || (flags & RENAME_EXCHANGE))
        return CALL_RENAME();
    in_shim = 1;
    if (resolve(od, op, ofull, &odev, &oino) != 0 || resolve(nd, np, nfull, &ndev, &nino) != 0) {
        in_shim = 0;
        return CALL_RENAME();
    }
    pthread_mutex_lock(&mu);
    struct stat so, sn;
    if (raw_lstat(ofull, &so) != 0 || !S_ISREG(so.st_mode)) { /* directories, symlinks: not emulated */
        int r = CALL_RENAME();
        int e = errno;
        pthread_mutex_unlock(&mu);
        in_shim = 0;
        errno = e;
        return r;
    }
    int replaced = raw_lstat(nfull, &sn) == 0 && S_ISREG(sn.st_mode) &&
                   !(sn.st_dev == so.st_dev && sn.st_ino == so.st_ino);
    uint64_t seq = next_seq();
    keep[0] = 0;
    if (replaced)
        keep_link(nfull, seq, keep);
    uint64_t v[8] = {odev, oino, ndev, nino, so.st_dev, so.st_ino, replaced ? sn.st_dev : 0,
                     replaced ? sn.st_ino : 0};
    const char *s[3] = {ofull, nfull, keep};
    emit(R_RENAME, seq, v, 8, s, 3, NULL, 0);
    int r = CALL_RENAME();
    int e = errno;
    if (r == 0)
        pend_add(ndev, nino, seq, keep);
    else if (keep[0])
        raw_unlink(keep);
    pthread_mutex_unlock(&mu);
    in_shim = 0;
    errno = e;
    return r;
#undef CALL_RENAME
}

EXPORT int rename(const char *o, const char *n) { return do_rename(RN_RENAME, AT_FDCWD, o, AT_FDCWD, n, 0); }
EXPORT int renameat(int od, const char *o, int nd, const char *n)
{
    return do_rename(RN_RENAMEAT, od, o, nd, n, 0);
}
EXPORT int renameat2(int od, const char *o, int nd, const char *n, unsigned int flags)
{
    return do_rename(RN_RENAMEAT2, od, o, nd, n, flags);
}

enum { UL_UNLINK, UL_UNLINKAT, UL_REMOVE };

static int do_unlink(int k, int dirfd, const char *p, int flags)
{
#define CALL_UNLINK()                                                                                          \
    (k == UL_UNLINK ? REAL(unlink)(p) : k == UL_UNLINKAT ? REAL(unlinkat)(dirfd, p, flags) : REAL(remove)(p))
    char full[PATH_MAX], keep[PATH_MAX];
    uint64_t ddev, dino;
    if (!active || in_shim || (flags & AT_REMOVEDIR))
        return CALL_UNLINK();
    in_shim = 1;
    if (resolve(dirfd, p, full, &ddev, &dino) != 0) {
        in_shim = 0;
        return CALL_UNLINK();
    }
    pthread_mutex_lock(&mu);
    struct stat st;
    if (raw_lstat(full, &st) != 0 || !S_ISREG(st.st_mode)) {
        int r = CALL_UNLINK();
        int e = errno;
        pthread_mutex_unlock(&mu);
        in_shim = 0;
        errno = e;
        return r;
    }
    uint64_t seq = next_seq();
    keep_link(full, seq, keep);
    uint64_t v[4] = {ddev, dino, st.st_dev, st.st_ino};
    const char *s[2] = {full, keep};
    emit(R_UNLINK, seq, v, 4, s, 2, NULL, 0);
    int r = CALL_UNLINK();
    int e = errno;
    if (r == 0)
        pend_add(ddev, dino, seq, keep);
    else if (keep[0])
        raw_unlink(keep);
    pthread_mutex_unlock(&mu);
    in_shim = 0;
    errno = e;
    return r;
#undef CALL_UNLINK
}

EXPORT int unlink(const char *p) { return do_unlink(UL_UNLINK, AT_FDCWD, p, 0); }
EXPORT int unlinkat(int dirfd, const char *p, int flags) { return do_unlink(UL_UNLINKAT, dirfd, p, flags); }
EXPORT int remove(const char *p) { return do_unlink(UL_REMOVE, AT_FDCWD, p, 0); }

/* link(2): a new name for an existing inode; gone at the crash unless its directory was synced. */
static int do_link(int k, int od, const char *op, int nd, const char *np, int flags)
{
#define CALL_LINK() (k == 0 ? REAL(link)(op, np) : REAL(linkat)(od, op, nd, np, flags))
    char full[PATH_MAX];
    uint64_t ddev, dino;
    if (!active || in_shim)
        return CALL_LINK();
    in_shim = 1;
    if (resolve(nd, np, full, &ddev, &dino) != 0) {
        in_shim = 0;
        return CALL_LINK();
    }
    pthread_mutex_lock(&mu);
    int r = CALL_LINK();
    int e = errno;
    struct stat st;
    if (r == 0 && raw_lstat(full, &st) == 0 && S_ISREG(st.st_mode)) {
        uint64_t v[5] = {ddev, dino, st.st_dev, st.st_ino, 0};
        uint64_t seq = next_seq();
        const char *s[1] = {full};
        emit(R_NEWNAME, seq, v, 5, s, 1, NULL, 0);
        pend_add(ddev, dino, seq, NULL);
    }
    pthread_mutex_unlock(&mu);
    in_shim = 0;
    errno = e;
    return r;
#undef CALL_LINK
}

EXPORT int link(const char *o, const char *n) { return do_link(0, AT_FDCWD, o, AT_FDCWD, n, 0); }
EXPORT int linkat(int od, const char *o, int nd, const char *n, int flags)
{
    return do_link(1, od, o, nd, n, flags);
}

/* ------------------------------------------------------------ init, fork */
static void before_fork(void) { pthread_mutex_lock(&mu); }
static void after_fork_parent(void) { pthread_mutex_unlock(&mu); }
static void after_fork_child(void)
{
    pthread_mutex_init(&mu, NULL);
    /* The child writes its own journal; the writeback thread did not survive fork. */
    if (jfd >= 0)
        raw_close(jfd);
    jfd = -1;
    flusher_started = 0;
    in_shim = 0;
}

static void strip_slashes(char *p, size_t *len)
{
    *len = strlen(p);
    while (*len > 1 && p[*len - 1] == '/')
        p[--*len] = 0;
}

__attribute__((constructor)) static void init(void)
{
    const char *r = getenv("POWERLOSS_ROOT"), *u = getenv("POWERLOSS_UNDO_DIR");
    if (!r || !*r || !u || !*u)
        return;
    if (!realpath(r, root))
        snprintf(root, sizeof root, "%s", r); /* not created yet: powerloss.py passes a resolved path */
    if (!realpath(u, undo))
        snprintf(undo, sizeof undo, "%s", u);
    strip_slashes(root, &root_len);
    strip_slashes(undo, &undo_len);
    if (undo_len > 3900) {
        warn("POWERLOSS_UNDO_DIR is too long: nothing is tracked");
        return;
    }
    const char *w = getenv("POWERLOSS_WRITEBACK_S");
    if (w && *w) {
        double s = strtod(w, NULL);
        if (s > 0)
            writeback_ns = (uint64_t)(s * 1e9);
    }
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    active = 1;
}
