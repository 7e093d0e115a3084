// Does splicing READ replies into /dev/fuse save the kernel's copy into the page cache?
//
// A FUSE file system of one file, `f`, whose bytes are those of BACKING, answering READ in one
// of four ways (MODE):
//   mem          from memory (BACKING mapped and locked): one writev, the kernel copies the
//                reply into the file's page cache. This is how riffle answers a cached read
//                without passthrough (its blocks are in memory, read there with O_DIRECT).
//   splice       BACKING's page cache -> pipe -> /dev/fuse (FUSE_SPLICE_WRITE): the kernel
//                copies the pipe's pages into the FUSE file's page cache.
//   move         the same with SPLICE_F_MOVE (FUSE_SPLICE_MOVE): the kernel may steal the
//                pipe's pages and put them in the FUSE file's page cache instead of copying.
//   move-direct  move, BACKING opened O_DIRECT: the pipe's pages are fresh ones the kernel just
//                read the disk into (nobody else holds them), the case where stealing works.
// libfuse's own splice path (fuse_reply_data) does the splicing, with 8 threads.
//
// Built and run by benches/splice_probe.sh; needs libfuse3-dev. Not part of riffle's build.
#define FUSE_USE_VERSION 34
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int backing_fd;
static off_t backing_size;
static char *mapped;
static enum { MEM, SPLICE, MOVE } mode;

static void attr_of(fuse_ino_t ino, struct stat *st) {
    memset(st, 0, sizeof *st);
    st->st_ino = ino;
    if (ino == FUSE_ROOT_ID) {
        st->st_mode = S_IFDIR | 0755;
        st->st_nlink = 2;
    } else {
        st->st_mode = S_IFREG | 0444;
        st->st_nlink = 1;
        st->st_size = backing_size;
    }
}

static void op_init(void *userdata, struct fuse_conn_info *conn) {
    (void)userdata;
    conn->want &= ~(FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE | FUSE_CAP_SPLICE_READ);
    if (mode == SPLICE || mode == MOVE) conn->want |= FUSE_CAP_SPLICE_WRITE;
    if (mode == MOVE) conn->want |= FUSE_CAP_SPLICE_MOVE;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
    if (parent != FUSE_ROOT_ID || strcmp(name, "f") != 0) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    struct fuse_entry_param e;
    memset(&e, 0, sizeof e);
    e.ino = 2;
    e.attr_timeout = e.entry_timeout = 3600;
    attr_of(e.ino, &e.attr);
    fuse_reply_entry(req, &e);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)fi;
    struct stat st;
    attr_of(ino, &st);
    fuse_reply_attr(req, &st, 3600);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)ino;
    fuse_reply_open(req, fi);
}

static size_t clamp(off_t off, size_t size) {
    if (off >= backing_size) return 0;
    return (size_t)(backing_size - off) < size ? (size_t)(backing_size - off) : size;
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi) {
    (void)ino;
    (void)fi;
    size_t n = clamp(off, size);
    if (mode == MEM) {
        fuse_reply_buf(req, mapped + off, n);
        return;
    }
    struct fuse_bufvec bv = FUSE_BUFVEC_INIT(n);
    bv.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
    bv.buf[0].fd = backing_fd;
    bv.buf[0].pos = off;
    fuse_reply_data(req, &bv, mode == MOVE ? FUSE_BUF_SPLICE_MOVE : 0);
}

static const struct fuse_lowlevel_ops ops = {
    .init = op_init, .lookup = op_lookup, .getattr = op_getattr, .open = op_open, .read = op_read,
};

int main(int argc, char *argv[]) {
    if (argc != 4) {
        fprintf(stderr, "usage: splice_probe mem|splice|move|move-direct BACKING MOUNTPOINT\n");
        return 2;
    }
    int flags = O_RDONLY;
    if (strcmp(argv[1], "mem") == 0) mode = MEM;
    else if (strcmp(argv[1], "splice") == 0) mode = SPLICE;
    else if (strcmp(argv[1], "move") == 0) mode = MOVE;
    else if (strcmp(argv[1], "move-direct") == 0) mode = MOVE, flags |= O_DIRECT;
    else {
        fprintf(stderr, "splice_probe: unknown mode %s\n", argv[1]);
        return 2;
    }
    backing_fd = open(argv[2], flags);
    if (backing_fd < 0) {
        perror("splice_probe: open");
        return 1;
    }
    backing_size = lseek(backing_fd, 0, SEEK_END);
    if (mode == MEM) {
        mapped = mmap(NULL, backing_size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, backing_fd, 0);
        if (mapped == MAP_FAILED || mlock(mapped, backing_size) != 0) {
            perror("splice_probe: mmap");
            return 1;
        }
    }
    char *fuse_argv[] = {argv[0], "-o", "ro", NULL};
    struct fuse_args args = FUSE_ARGS_INIT(3, fuse_argv);
    struct fuse_session *se = fuse_session_new(&args, &ops, sizeof ops, NULL);
    if (se == NULL || fuse_session_mount(se, argv[3]) != 0) return 1;
    struct fuse_loop_config *loop = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(loop, 8);
    fuse_loop_cfg_set_idle_threads(loop, 8);
    int rc = fuse_session_loop_mt(se, loop);
    fuse_session_unmount(se);
    fuse_session_destroy(se);
    return rc == 0 ? 0 : 1;
}
