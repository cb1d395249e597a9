/* The zygote's clone loop and a child's set-up, in C.
 *
 * The same steps as the Python loop in zygote.py and child_main in child.py, for the
 * common case (PID namespace, single-threaded zygote, its environment the snippets'):
 * every page a forked child writes is a copy-on-write fault, and a Python set-up
 * writes hundreds (reference counts, frames, allocator pools) before the user's first
 * line; the zygote's own loop in Python writes pages it shares with every live child.
 * Here the loop and the set-up write their C stack and little else.
 *
 * serve() runs the loop until the supervisor goes away (returns None in the zygote).
 * In a child it returns (code, flags): the request read, its limits applied and "ready"
 * said, or, for a request with inputs (files, stdin, cells), (whole request, -1) before
 * its limits, for the Python side to finish. Any set-up failure writes one line to the
 * child's stderr and exits 126, as child_main's does. say_done() tells the supervisor a
 * snippet's end before its exit's teardown (runtime.finish). Built when a compiler is there;
 * without it zygote.py runs the Python loop.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifdef __linux__
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

/* The contract with the Python side: contract.py defines each of these once, with why;
 * they are exported as CONTRACT and native.py refuses a build that disagrees. */
#define REQUEST_FD 3
#define DONE_FD 4
#define SETUP_FAILED_EXIT 126
#define MAX_OPEN_FILES 256
#define READY 'R'
/* The request header, contract.HEAD_FORMAT: each field at its offset, read by u32_at
 * (an "I") or as one byte (a "B"). */
#define HEAD_FORMAT "!IIIIIIBB"
#define HEAD_SIZE 26
#define HEAD_CODE_LEN 0
#define HEAD_EXTRA_LEN 4
#define HEAD_CPU_S 8
#define HEAD_MEMORY_MB 12
#define HEAD_MAX_FILE_MB 16
#define HEAD_MAX_PROCS 20
#define HEAD_AUTO_PRINT 24
#define HEAD_RICH_TRACEBACKS 25
#define FLAG_AUTO_PRINT 1
#define FLAG_RICH_TRACEBACKS 2
#define DONE_MAGIC 0x454e4f44u /* "DONE" */
#define FIRST_PID 1
#define MT_WORDS 624
/* Bumped whenever serve()'s arguments or what it returns change: native.py refuses a
 * stale build (an in-place .so left from an older checkout) instead of crashing. */
#define NATIVE_ABI 9

#define MAX_PATHS 64
#define MAX_RULES 256
#define MAX_GENERATORS 4

#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#define SYS_landlock_add_rule 445
#define SYS_landlock_restrict_self 446
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef PR_CAP_AMBIENT
#define PR_CAP_AMBIENT 47
#define PR_CAP_AMBIENT_CLEAR_ALL 4
#endif

struct path_beneath {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

struct ruleset_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net;
    uint64_t scoped;
};

/* What every child of this zygote does alike; filled once by serve(). */
struct plan {
    unsigned long clone_flags;
    int spawn;
    const char *tmpfs_options;
    const char *roots[MAX_PATHS]; /* fresh tmpfs each */
    int nroots;
    const char *binds[MAX_PATHS]; /* bound back into them */
    int nbinds;
    const char *workdir;
    int last_cap;
    long nproc_headroom;
    unsigned long long vm_baseline;
    /* Landlock: abi 0 means none. */
    int abi;
    struct ruleset_attr attr;
    size_t attr_size;
    uint64_t read_only, file_only;
    struct path_beneath rules[MAX_RULES];
    int nrules;
    int fd_first, fd_stop;
    const char *writable[MAX_PATHS];
    int nwritable;
    const char *readable[MAX_PATHS];
    int nreadable;
    struct sock_fprog seccomp;
    /* Generators to reseed (see native.generators): a key of MT_WORDS words, then the
     * position that makes the next draw regenerate from it. */
    uint32_t *mt_keys[MAX_GENERATORS];
    int *mt_positions[MAX_GENERATORS];
    int ngenerators;
    PyObject *warm; /* called in each waiting child before it reads its request, or NULL */
    /* SIGINT as a snippet has it (Python's handler: KeyboardInterrupt); the zygote
     * itself ignores it, its owner's to act on. */
    struct sigaction sigint;
};

static void fail(const char *what, int err) {
    char line[512];
    int n = snprintf(line, sizeof line, "codepool child set-up failed: %s: %s\n", what,
                     strerror(err));
    if (n > 0) {
        ssize_t ignored = write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
        (void)ignored;
    }
    _exit(SETUP_FAILED_EXIT);
}

static void check(int ret, const char *what) {
    if (ret < 0)
        fail(what, errno);
}

static int close_from(int first, int stop) {
    if (first >= stop)
        return 0;
    if (syscall(SYS_close_range, (unsigned)first, (unsigned)(stop - 1), 0) == 0)
        return 0;
    for (int fd = first; fd < stop; fd++)
        close(fd);
    return 0;
}

static void arrange_fds(const struct plan *p, const int fds[4]) {
    /* Out of the way first, so the dup2s cannot clobber each other. */
    int high[4];
    for (int i = 0; i < 4; i++)
        check(high[i] = fcntl(fds[i], F_DUPFD, 0), "dup");
    int devnull = open("/dev/null", O_RDONLY);
    check(devnull, "open /dev/null");
    check(dup2(devnull, 0), "dup2");
    check(dup2(high[1], 1), "dup2");
    check(dup2(high[2], 2), "dup2");
    check(dup2(high[0], REQUEST_FD), "dup2");
    check(dup2(high[3], DONE_FD), "dup2");
    /* Nothing of the zygote's stays reachable; the Landlock fds go once restricted. */
    struct rlimit files;
    check(getrlimit(RLIMIT_NOFILE, &files), "getrlimit");
    int top = files.rlim_max > 1 << 20 ? 1 << 20 : (int)files.rlim_max;
    if (p->fd_stop > p->fd_first) {
        close_from(DONE_FD + 1, p->fd_first);
        close_from(p->fd_stop, top);
    } else {
        close_from(DONE_FD + 1, top);
    }
}

static void make_dirs(const char *path) {
    char buf[4096];
    size_t len = strlen(path);
    if (len >= sizeof buf)
        fail("path too long", ENAMETOOLONG);
    memcpy(buf, path, len + 1);
    for (char *s = buf + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(buf, 0755) < 0 && errno != EEXIST)
            fail(buf, errno);
        *s = '/';
    }
    if (mkdir(buf, 0755) < 0 && errno != EEXIST)
        fail(buf, errno);
}

static void bind_back(const char *path, int fd) {
    struct stat st;
    check(fstat(fd, &st), path);
    if (S_ISDIR(st.st_mode)) {
        make_dirs(path);
    } else {
        char parent[4096];
        size_t len = strlen(path);
        if (len >= sizeof parent)
            fail("path too long", ENAMETOOLONG);
        memcpy(parent, path, len + 1);
        char *slash = strrchr(parent, '/');
        if (slash != NULL && slash != parent) {
            *slash = '\0';
            make_dirs(parent);
        }
        int made = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
        check(made, path);
        close(made);
    }
    char source[64];
    snprintf(source, sizeof source, "/proc/self/fd/%d", fd);
    check(mount(source, path, NULL, MS_BIND | MS_REC, NULL), path);
}

/* isolation.setup_child: fresh tmpfs roots, the paths under them bound back, a /proc
 * that shows only the snippet, the work dir. */
static void setup_mounts(const struct plan *p, int uid) {
    int keep[MAX_PATHS];
    for (int i = 0; i < p->nbinds; i++) {
        keep[i] = open(p->binds[i], O_PATH | O_CLOEXEC);
        check(keep[i], p->binds[i]);
    }
    for (int i = 0; i < p->nroots; i++)
        check(mount("tmpfs", p->roots[i], "tmpfs", MS_NOSUID | MS_NODEV, p->tmpfs_options),
              p->roots[i]);
    for (int i = 0; i < p->nbinds; i++) {
        bind_back(p->binds[i], keep[i]);
        close(keep[i]);
    }
    check(mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL), "/proc");
    check(mkdir(p->workdir, 0700), p->workdir);
    if (uid >= 0)
        check(chown(p->workdir, (uid_t)uid, (gid_t)uid), "chown work dir");
}

struct cap_header {
    uint32_t version;
    int pid;
};
struct cap_data {
    uint32_t effective, permitted, inheritable;
};

static void drop_privileges(const struct plan *p, int uid) {
    if (uid >= 0) {
        check(setgroups(0, NULL), "setgroups");
        check(setresgid((gid_t)uid, (gid_t)uid, (gid_t)uid), "setresgid");
        check(setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid), "setresuid");
        /* The uid change cleared these; dumpable keeps /proc/self readable. */
        check(prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "PR_SET_DUMPABLE");
        check(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS");
        check(prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0), "PR_SET_PDEATHSIG");
        return;
    }
    /* A user namespace's owner holds every capability: drop them all for good. */
    for (int cap = 0; cap <= p->last_cap; cap++)
        prctl(PR_CAPBSET_DROP, cap, 0, 0, 0); /* EPERM without CAP_SETPCAP: none to drop */
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    struct cap_header header = {0x20080522, 0};
    struct cap_data data[2];
    memset(data, 0, sizeof data);
    check((int)syscall(SYS_capset, &header, data), "capset");
}

static void allow_path(int ruleset, const char *path, uint64_t access, uint64_t file_only) {
    int fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return;
        fail(path, errno);
    }
    struct stat st;
    check(fstat(fd, &st), path);
    if (!S_ISDIR(st.st_mode))
        access &= file_only;
    struct path_beneath rule = {access, fd};
    check((int)syscall(SYS_landlock_add_rule, ruleset, 1, &rule, 0), path);
    close(fd);
}

/* child._restrict: Landlock, then seccomp. */
static void restrict_self(const struct plan *p) {
    check(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS");
    if (p->abi) {
        int ruleset = (int)syscall(SYS_landlock_create_ruleset, &p->attr, p->attr_size, 0);
        check(ruleset, "landlock_create_ruleset");
        for (int i = 0; i < p->nrules; i++)
            check((int)syscall(SYS_landlock_add_rule, ruleset, 1, &p->rules[i], 0),
                  "landlock_add_rule");
        for (int i = 0; i < p->nwritable; i++)
            allow_path(ruleset, p->writable[i], p->attr.handled_access_fs, p->file_only);
        for (int i = 0; i < p->nreadable; i++)
            allow_path(ruleset, p->readable[i], p->read_only, p->file_only);
        check((int)syscall(SYS_landlock_restrict_self, ruleset, 0), "landlock_restrict_self");
        close(ruleset);
        close_from(p->fd_first, p->fd_stop);
    }
    if (p->seccomp.len)
        check(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &p->seccomp, 0, 0), "seccomp filter");
}

static int read_full(int fd, char *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, buf + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            fail("read request", errno);
        if (n == 0)
            return 0;
        got += (size_t)n;
    }
    return 1;
}

static uint32_t u32_at(const unsigned char *head, int offset) {
    uint32_t v;
    memcpy(&v, head + offset, 4);
    return ntohl(v);
}

static void set_limit(int resource, rlim_t value, const char *what) {
    struct rlimit limit = {value, value};
    check(setrlimit(resource, &limit), what);
}

static void fill_random(void *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        long n = syscall(SYS_getrandom, (char *)buf + got, len - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            fail("getrandom", n < 0 ? errno : EIO);
        got += (size_t)n;
    }
}

/* child._reseed's work, without a Python call: a fresh key from the kernel for every
 * generator the zygote found (and checked the layout of), as a fresh interpreter's
 * would get. */
static void reseed(const struct plan *p) {
    for (int i = 0; i < p->ngenerators; i++) {
        fill_random(p->mt_keys[i], MT_WORDS * sizeof(uint32_t));
        *p->mt_positions[i] = MT_WORDS;
    }
}

/* In the cloned child: everything child_main does before the user's first line. */
static PyObject *child(const struct plan *p, int control, int uid, int fds[4]) {
    close(control);
    check(prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0), "PR_SET_PDEATHSIG");
    /* Spawn mode: a handler becomes the default at exec, and Python installs its own. */
    check(sigaction(SIGINT, &p->sigint, NULL), "sigaction");
    arrange_fds(p, fds);
    reseed(p);
    setup_mounts(p, uid);
    drop_privileges(p, uid);
    check(chdir(p->workdir), "chdir");
    restrict_self(p);
    if (p->warm != NULL) {
        /* What it copies on write is copied now, while no request waits for it. */
        PyObject *ignored = PyObject_CallNoArgs(p->warm);
        if (ignored == NULL)
            PyErr_Clear();
        Py_XDECREF(ignored);
    }

    unsigned char head[HEAD_SIZE];
    if (!read_full(REQUEST_FD, (char *)head, HEAD_SIZE))
        _exit(0); /* the zygote went away or discarded this warm child */
    uint32_t code_len = u32_at(head, HEAD_CODE_LEN), extra_len = u32_at(head, HEAD_EXTRA_LEN);
    if (code_len > (1u << 30) || extra_len > (1u << 30))
        fail("request", EMSGSIZE);
    if (extra_len) {
        /* Inputs: the Python side writes them, then applies the limits. */
        PyObject *whole = PyBytes_FromStringAndSize(NULL, HEAD_SIZE + code_len + extra_len);
        if (whole == NULL)
            fail("request", ENOMEM);
        memcpy(PyBytes_AS_STRING(whole), head, HEAD_SIZE);
        if (!read_full(REQUEST_FD, PyBytes_AS_STRING(whole) + HEAD_SIZE, code_len + extra_len))
            _exit(0);
        return Py_BuildValue("(Ni)", whole, -1);
    }
    PyObject *code = PyBytes_FromStringAndSize(NULL, code_len);
    if (code == NULL)
        fail("request", ENOMEM);
    if (!read_full(REQUEST_FD, PyBytes_AS_STRING(code), code_len))
        _exit(0);
    rlim_t cpu_s = u32_at(head, HEAD_CPU_S), memory_mb = u32_at(head, HEAD_MEMORY_MB);
    rlim_t file_mb = u32_at(head, HEAD_MAX_FILE_MB), procs = u32_at(head, HEAD_MAX_PROCS);
    struct rlimit cpu = {cpu_s, cpu_s + 1};
    check(setrlimit(RLIMIT_CPU, &cpu), "RLIMIT_CPU");
    set_limit(RLIMIT_AS, p->vm_baseline + (memory_mb << 20), "RLIMIT_AS");
    set_limit(RLIMIT_FSIZE, file_mb << 20, "RLIMIT_FSIZE");
    set_limit(RLIMIT_NOFILE, MAX_OPEN_FILES, "RLIMIT_NOFILE");
    set_limit(RLIMIT_CORE, 0, "RLIMIT_CORE");
    set_limit(RLIMIT_NPROC, procs + (uid >= 0 ? 0 : p->nproc_headroom), "RLIMIT_NPROC");
    /* Ready: anything after this is the user's doing. */
    const char ready = READY;
    while (write(REQUEST_FD, &ready, 1) < 0)
        if (errno != EINTR)
            fail("say ready", errno);
    if (!p->spawn) /* spawn: the source takes its place (child._exec_interpreter) */
        close(REQUEST_FD);
    int flags = head[HEAD_AUTO_PRINT] ? FLAG_AUTO_PRINT : 0;
    flags |= head[HEAD_RICH_TRACEBACKS] ? FLAG_RICH_TRACEBACKS : 0;
    return Py_BuildValue("(Ni)", code, flags);
}

/* -- argument parsing (once per zygote) -------------------------------------------- */

static int str_list(PyObject *seq, const char **out, int *count, const char *what) {
    PyObject *fast = PySequence_Fast(seq, what);
    if (fast == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > MAX_PATHS) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "%s: at most %d paths", what, MAX_PATHS);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        /* The strings live as long as the plan's Python objects, which serve() holds. */
        out[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(fast, i));
        if (out[i] == NULL) {
            Py_DECREF(fast);
            return -1;
        }
    }
    *count = (int)n;
    Py_DECREF(fast);
    return 0;
}

/* A list of at most ``max`` pairs of unsigned integers into ``out``; returns the count,
 * or -1 with an exception set. */
static int parse_pairs(PyObject *seq, unsigned long long (*out)[2], int max, const char *what) {
    PyObject *fast = PySequence_Fast(seq, what);
    if (fast == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > max) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "%s: at most %d", what, max);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "KK", &out[i][0], &out[i][1])) {
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    return (int)n;
}

/* rules: (access, fd) per prepared Landlock rule; generators: (key, position) addresses. */
static int parse_rules_and_generators(PyObject *rules, PyObject *generators, struct plan *p) {
    unsigned long long pairs[MAX_RULES][2];
    int n = parse_pairs(rules, pairs, MAX_RULES, "rules");
    if (n < 0)
        return -1;
    for (int i = 0; i < n; i++) {
        p->rules[i].allowed_access = pairs[i][0];
        p->rules[i].parent_fd = (int32_t)pairs[i][1];
    }
    p->nrules = n;
    n = parse_pairs(generators, pairs, MAX_GENERATORS, "generators");
    if (n < 0)
        return -1;
    for (int i = 0; i < n; i++) {
        p->mt_keys[i] = (uint32_t *)(uintptr_t)pairs[i][0];
        p->mt_positions[i] = (int *)(uintptr_t)pairs[i][1];
    }
    p->ngenerators = n;
    return 0;
}

/* write_state(key_address, position_address, key): what each child does to the
 * generators, with a given key: native.generators checks with it that the addresses
 * name what it thinks before serve() is trusted with them. */
static PyObject *write_state(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long key, position;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "KKy*:write_state", &key, &position, &data))
        return NULL;
    if (data.len != MT_WORDS * sizeof(uint32_t)) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "a key is 624 32-bit words");
        return NULL;
    }
    memcpy((void *)(uintptr_t)key, data.buf, (size_t)data.len);
    *(int *)(uintptr_t)position = MT_WORDS;
    PyBuffer_Release(&data);
    Py_RETURN_NONE;
}

static int recv_request(int control, int *uid, int fds[4]) {
    char data[64];
    char control_buf[CMSG_SPACE(4 * sizeof(int))];
    struct iovec iov = {data, sizeof data};
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control_buf;
    msg.msg_controllen = sizeof control_buf;
    ssize_t n;
    while ((n = recvmsg(control, &msg, MSG_CMSG_CLOEXEC)) < 0) {
        if (errno != EINTR)
            return 0;
        if (PyErr_CheckSignals() < 0)
            return -1;
    }
    int got = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        int count = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        int *passed = (int *)CMSG_DATA(c);
        for (int i = 0; i < count; i++) {
            if (got < 4)
                fds[got++] = passed[i];
            else
                close(passed[i]);
        }
    }
    if (n < 4 || got != 4 || (msg.msg_flags & MSG_CTRUNC)) {
        for (int i = 0; i < got; i++)
            close(fds[i]);
        return 0; /* the supervisor is gone, or did not speak the protocol */
    }
    uint32_t raw;
    memcpy(&raw, data, 4);
    *uid = (int32_t)ntohl(raw);
    return 1;
}

static PyObject *serve(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {
        "control", "clone_flags", "spawn", "tmpfs_options", "roots", "binds", "workdir",
        "last_cap", "nproc_headroom", "vm_baseline", "abi", "handled_fs", "handled_net",
        "scoped", "attr_size", "read_only", "file_only", "rules", "fd_range",
        "writable", "readable", "seccomp", "generators", "warm", NULL};
    (void)self;
    static struct plan p; /* static: a child's C stack stays small */
    int control, spawn, abi;
    unsigned long clone_flags;
    long nproc_headroom;
    unsigned long long vm_baseline, handled_fs, handled_net, scoped, read_only,
        file_only;
    Py_ssize_t attr_size;
    int fd_first, fd_stop;
    PyObject *roots, *binds, *rules, *writable, *readable, *generators, *warm = Py_None;
    const char *tmpfs_options, *workdir;
    Py_buffer filter = {0};
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "ikpsOOsilKiKKKnKKO(ii)OOy*O|O:serve", names, &control, &clone_flags,
            &spawn, &tmpfs_options, &roots, &binds, &workdir, &p.last_cap, &nproc_headroom,
            &vm_baseline, &abi, &handled_fs, &handled_net, &scoped, &attr_size,
            &read_only, &file_only, &rules, &fd_first, &fd_stop, &writable, &readable,
            &filter, &generators, &warm))
        return NULL;
    if (filter.len % sizeof(struct sock_filter) ||
        filter.len / sizeof(struct sock_filter) > BPF_MAXINSNS ||
        (size_t)attr_size > sizeof(struct ruleset_attr) ||
        (warm != Py_None && !PyCallable_Check(warm))) {
        PyBuffer_Release(&filter);
        PyErr_SetString(PyExc_ValueError,
                        "malformed seccomp program or Landlock attr size, or warm not callable");
        return NULL;
    }
    p.warm = warm == Py_None ? NULL : warm; /* the caller's reference outlives serve */
    /* The caller set the snippets' signal dispositions (runtime.reference_signals). */
    struct sigaction ignore;
    memset(&ignore, 0, sizeof ignore);
    ignore.sa_handler = SIG_IGN;
    if (sigaction(SIGINT, &ignore, &p.sigint) < 0) {
        PyBuffer_Release(&filter);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    p.clone_flags = clone_flags;
    p.spawn = spawn;
    p.tmpfs_options = tmpfs_options;
    p.workdir = workdir;
    p.nproc_headroom = nproc_headroom;
    p.vm_baseline = vm_baseline;
    p.abi = abi;
    p.attr.handled_access_fs = handled_fs;
    p.attr.handled_access_net = handled_net;
    p.attr.scoped = scoped;
    p.attr_size = (size_t)attr_size;
    p.read_only = read_only;
    p.file_only = file_only;
    p.fd_first = fd_first;
    p.fd_stop = fd_stop;
    p.seccomp.len = (unsigned short)(filter.len / sizeof(struct sock_filter));
    p.seccomp.filter = (struct sock_filter *)filter.buf; /* held until serve returns */
    if (str_list(roots, p.roots, &p.nroots, "roots") < 0 ||
        str_list(binds, p.binds, &p.nbinds, "binds") < 0 ||
        str_list(writable, p.writable, &p.nwritable, "writable") < 0 ||
        str_list(readable, p.readable, &p.nreadable, "readable") < 0 ||
        parse_rules_and_generators(rules, generators, &p) < 0) {
        PyBuffer_Release(&filter);
        return NULL;
    }
    for (;;) {
        int uid, fds[4];
        int got = recv_request(control, &uid, fds);
        if (got < 0) {
            PyBuffer_Release(&filter);
            return NULL; /* a signal handler raised (SIGTERM: SystemExit) */
        }
        if (got == 0)
            break;
        long pid = syscall(SYS_clone, p.clone_flags | SIGCHLD, NULL, NULL, NULL, NULL);
        if (pid == 0)
            return child(&p, control, uid, fds); /* the filter's buffer is the child's now */
        int clone_errno = errno;
        for (int i = 0; i < 4; i++)
            close(fds[i]);
        if (pid < 0) {
            PyBuffer_Release(&filter);
            errno = clone_errno;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        int32_t reply = (int32_t)htonl((uint32_t)pid);
        ssize_t sent;
        while ((sent = send(control, &reply, sizeof reply, MSG_NOSIGNAL)) < 0 && errno == EINTR)
            ;
        if (sent != sizeof reply)
            break; /* the supervisor is gone */
    }
    PyBuffer_Release(&filter);
    Py_RETURN_NONE;
}

/* The last pid given out in the caller's PID namespace: 1 when the child (its init)
 * never made a process or thread; -1 if unreadable. */
static int ns_last_pid(void) {
    int fd = open("/proc/sys/kernel/ns_last_pid", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    char buf[16];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    return atoi(buf);
}

/* The done notice, as contract.DONE_FORMAT packs it. */
struct __attribute__((packed)) notice {
    int32_t code;
    uint32_t magic;
    int64_t cpu_us, max_rss_kb;
    int32_t last_pid;
};
#define DONE_SIZE ((int)sizeof(struct notice))

/* say_done(code): the snippet's end (exit code, or minus the signal that ended it), CPU
 * microseconds and peak RSS in KiB of the child and what it reaped, its PID namespace's
 * last pid, written to DONE_FD before the exit tears the image down. Said only by the
 * snippet's first process (FIRST_PID, its namespace's init): a process it forked ends
 * in its own way and the snippet goes on. Best effort: a full or closed pipe leaves the
 * supervisor waiting for the exit instead. */
static void write_notice(long code) {
    /* Only system calls: a signal handler says it too (on_fatal_signal). */
    struct rusage own, reaped;
    if (getrusage(RUSAGE_SELF, &own) < 0 || getrusage(RUSAGE_CHILDREN, &reaped) < 0)
        return;
    struct notice notice = {(int32_t)code, DONE_MAGIC, 0,
                            own.ru_maxrss > reaped.ru_maxrss ? own.ru_maxrss : reaped.ru_maxrss,
                            ns_last_pid()};
    const struct timeval *times[4] = {&own.ru_utime, &own.ru_stime, &reaped.ru_utime,
                                      &reaped.ru_stime};
    for (int i = 0; i < 4; i++)
        notice.cpu_us += (int64_t)times[i]->tv_sec * 1000000 + times[i]->tv_usec;
    ssize_t ignored = write(DONE_FD, &notice, sizeof notice);
    (void)ignored;
}

static PyObject *say_done(PyObject *self, PyObject *arg) {
    (void)self;
    long code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    if (getpid() == FIRST_PID)
        write_notice(code);
    Py_RETURN_NONE;
}

/* A PID namespace's init is spared every signal sent from inside it whose action is the
 * default: the kernel drops them, so a snippet that is its namespace's init would go on
 * after os.kill(os.getpid(), SIGTERM), signal.alarm or its CPU limit's SIGXCPU, and
 * os.abort() would end by SIGSEGV. This handler stands for the default action: in the
 * snippet's init, the done notice says the signal (the supervisor then kills it and
 * reports it as killed by that signal); in any other process (a fork, a zygote, a
 * context's reaper) the default action itself. It is set where Python's table says
 * SIG_DFL, so signal.getsignal still says so; a handler the snippet sets replaces it, as
 * it would replace the default. */
static volatile sig_atomic_t snippet_init = 0;
static int stand_ins_armed = 0; /* in this image: a fork inherits them, an exec does not */

static void on_fatal_signal(int sig) {
    if (snippet_init && getpid() == FIRST_PID) {
        write_notice(-sig);
        _exit(128 + sig);
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, NULL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    raise(sig);
}

/* arm_stand_ins(snippet): on_fatal_signal for every signal whose default action ends
 * the process and whose disposition is the default now, once per image (a zygote arms
 * them for all its children); ``snippet`` true: this process runs a snippet, so as its
 * namespace's init the handler speaks for it. Stop signals keep theirs (an init cannot
 * be stopped from inside either). Returns how many it set now. */
static PyObject *arm_stand_ins(PyObject *self, PyObject *arg) {
    (void)self;
    int snippet = PyObject_IsTrue(arg);
    if (snippet < 0)
        return NULL;
    long set = 0;
    if (!stand_ins_armed) {
        stand_ins_armed = 1;
        for (int sig = 1; sig < NSIG; sig++) {
            switch (sig) {
            case SIGKILL: case SIGSTOP: case SIGCHLD: case SIGCONT: case SIGURG:
            case SIGWINCH: case SIGTSTP: case SIGTTIN: case SIGTTOU:
                continue;
            default:
                break;
            }
            struct sigaction now;
            if (sigaction(sig, NULL, &now) < 0 || (now.sa_flags & SA_SIGINFO) ||
                now.sa_handler != SIG_DFL)
                continue;
            struct sigaction standin;
            memset(&standin, 0, sizeof standin);
            standin.sa_handler = on_fatal_signal;
            sigfillset(&standin.sa_mask);
            standin.sa_flags = SA_NODEFER;
            if (sigaction(sig, &standin, NULL) == 0)
                set++;
        }
    }
    snippet_init = snippet;
    return PyLong_FromLong(set);
}


/* run_main(code, globals): evaluate ``code`` as the bottom of the Python stack, as a
 * fresh interpreter runs ``python -c``'s: no frame of the harness below it (f_back,
 * traceback.print_stack, inspect.stack), and the recursion depth a fresh interpreter
 * starts from. The frames below are hidden, not gone: they are linked back once it
 * returns. Where this CPython's layout is not known here (HIDES_FRAMES 0) it is plain
 * evaluation. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define HIDES_FRAMES 1
#else
#define HIDES_FRAMES 0
#endif
static PyObject *run_main(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *code, *globals;
    if (!PyArg_ParseTuple(args, "O!O!:run_main", &PyCode_Type, &code, &PyDict_Type, &globals))
        return NULL;
#if HIDES_FRAMES
    PyThreadState *ts = PyThreadState_Get();
    _PyCFrame *cframe = ts->cframe;
    struct _PyInterpreterFrame *below = cframe->current_frame;
    int depth = ts->recursion_limit - ts->recursion_remaining;
    cframe->current_frame = NULL;
    ts->recursion_remaining = ts->recursion_limit;
    PyObject *result = PyEval_EvalCode(code, globals, globals);
    cframe->current_frame = below;
    /* The snippet may have changed the limit; the depth below is what it was. */
    ts->recursion_remaining = ts->recursion_limit - depth;
    return result;
#else
    return PyEval_EvalCode(code, globals, globals);
#endif
}

/* call_bare(callable): call it with no Python frame below it, as the interpreter's own
 * exit calls atexit's functions and threading's shutdown: what reports an error there
 * ("Exception ignored in atexit callback") shows no frame of the harness's. */
static PyObject *call_bare(PyObject *self, PyObject *callable) {
    (void)self;
#if HIDES_FRAMES
    PyThreadState *ts = PyThreadState_Get();
    _PyCFrame *cframe = ts->cframe;
    struct _PyInterpreterFrame *below = cframe->current_frame;
    cframe->current_frame = NULL;
    PyObject *result = PyObject_CallNoArgs(callable);
    cframe->current_frame = below;
    return result;
#else
    return PyObject_CallNoArgs(callable);
#endif
}

static PyMethodDef methods[] = {
    {"run_main", run_main, METH_VARARGS, "Evaluate code with no harness frame below it."},
    {"call_bare", call_bare, METH_O, "Call with no harness frame below it."},
    {"arm_stand_ins", arm_stand_ins, METH_O,
     "Handlers that do what the default action would, for a snippet that is an init."},
    {"say_done", say_done, METH_O, "Tell the supervisor the snippet ended with this code."},
    {"serve", (PyCFunction)(void (*)(void))serve, METH_VARARGS | METH_KEYWORDS,
     "Run the zygote's clone loop; returns None here, a request in each child."},
    {"write_state", write_state, METH_VARARGS,
     "Write an MT19937 key and position where a child's reseed would."},
    {NULL, NULL, 0, NULL}};
#else
static PyMethodDef methods[] = {{NULL, NULL, 0, NULL}};
#endif

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_nativechild",
                                    "The zygote's clone loop and a child's set-up, in C.", -1,
                                    methods};

#ifndef NATIVE_ABI
#define NATIVE_ABI 0 /* no C set-up on this platform */
#endif

/* CONTRACT: this build's copy of every constant contract.py defines for both sides. */
static PyObject *contract(void) {
    PyObject *dict = PyDict_New();
#ifdef __linux__
    static const struct {
        const char *name;
        long long value;
    } numbers[] = {
        {"REQUEST_FD", REQUEST_FD},
        {"DONE_FD", DONE_FD},
        {"SETUP_FAILED_EXIT", SETUP_FAILED_EXIT},
        {"MAX_OPEN_FILES", MAX_OPEN_FILES},
        {"READY", READY},
        {"HEAD_SIZE", HEAD_SIZE},
        {"HEAD_CODE_LEN", HEAD_CODE_LEN},
        {"HEAD_EXTRA_LEN", HEAD_EXTRA_LEN},
        {"HEAD_CPU_S", HEAD_CPU_S},
        {"HEAD_MEMORY_MB", HEAD_MEMORY_MB},
        {"HEAD_MAX_FILE_MB", HEAD_MAX_FILE_MB},
        {"HEAD_MAX_PROCS", HEAD_MAX_PROCS},
        {"HEAD_AUTO_PRINT", HEAD_AUTO_PRINT},
        {"HEAD_RICH_TRACEBACKS", HEAD_RICH_TRACEBACKS},
        {"FLAG_AUTO_PRINT", FLAG_AUTO_PRINT},
        {"FLAG_RICH_TRACEBACKS", FLAG_RICH_TRACEBACKS},
        {"DONE_SIZE", DONE_SIZE},
        {"DONE_MAGIC", DONE_MAGIC},
        {"FIRST_PID", FIRST_PID},
        {"MT_WORDS", MT_WORDS},
        {"NATIVE_ABI", NATIVE_ABI},
    };
    if (dict == NULL)
        return NULL;
    for (size_t i = 0; i < sizeof numbers / sizeof numbers[0]; i++) {
        PyObject *value = PyLong_FromLongLong(numbers[i].value);
        if (value == NULL || PyDict_SetItemString(dict, numbers[i].name, value) < 0) {
            Py_XDECREF(value);
            Py_DECREF(dict);
            return NULL;
        }
        Py_DECREF(value);
    }
    PyObject *format = PyUnicode_FromString(HEAD_FORMAT);
    if (format == NULL || PyDict_SetItemString(dict, "HEAD_FORMAT", format) < 0) {
        Py_XDECREF(format);
        Py_DECREF(dict);
        return NULL;
    }
    Py_DECREF(format);
#endif
    return dict;
}

PyMODINIT_FUNC PyInit__nativechild(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "ABI", NATIVE_ABI) < 0 ||
#ifdef __linux__
        PyModule_AddIntConstant(m, "HIDES_FRAMES", HIDES_FRAMES) < 0 ||
#endif
        PyModule_AddObject(m, "CONTRACT", contract()) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
