#!/usr/bin/python3
# tests/faults/flakyfs.py BACKING MOUNTPOINT CONTROL: a pass-through FUSE filesystem over the
# directory BACKING, mounted at MOUNTPOINT, that turns read-only and back on command, for the
# fault suite's `disk` case. Every operation is passed to BACKING (so its errors, ENOSPC from a
# full tmpfs among them, reach the caller as they are) until the file CONTROL says `ro`: from
# then on every operation that would change anything fails with EROFS — writes to files opened
# before included — as on a filesystem the kernel remounted read-only after an error. `rw`
# turns it back. CONTROL is read every 50 ms.
#
# Why not `mount -o remount,ro`: the kernel refuses to remount read-only a filesystem with
# files open for writing (EBUSY), and SQLite holds its database and WAL open for writing the
# whole time; a read-only turn under an open database happens only by the kernel's own hand,
# after I/O errors (ext4's errors=remount-ro), and on ext4 only an unmount ends it. This
# filesystem plays that turn, and also its end without an unmount.
#
# Runs under Debian's python3 with python3-fusepy (`apt-get install python3-fusepy`).

import errno
import os
import sys
import threading
import time

import fusepy as fuse

READ_ONLY = False


def watch(control):
    global READ_ONLY
    while True:
        try:
            with open(control) as f:
                READ_ONLY = f.read().strip() == "ro"
        except OSError:
            pass
        time.sleep(0.05)


def refuse_when_read_only():
    if READ_ONLY:
        raise fuse.FuseOSError(errno.EROFS)


def passed(call, *args):
    try:
        return call(*args)
    except OSError as e:
        raise fuse.FuseOSError(e.errno)


class Flaky(fuse.Operations):
    def __init__(self, root):
        self.root = os.path.realpath(root)

    def real(self, path):
        return self.root + path

    # Reading: always passed through.
    def access(self, path, mode):
        if not os.access(self.real(path), mode):
            raise fuse.FuseOSError(errno.EACCES)

    def getattr(self, path, fh=None):
        st = passed(os.lstat, self.real(path))
        keys = ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size", "st_uid")
        return {k: getattr(st, k) for k in keys}

    def readdir(self, path, fh):
        return [".", ".."] + passed(os.listdir, self.real(path))

    def readlink(self, path):
        return passed(os.readlink, self.real(path))

    def statfs(self, path):
        st = passed(os.statvfs, self.real(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")
        return {k: getattr(st, k) for k in keys}

    def open(self, path, flags):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            refuse_when_read_only()
        return passed(os.open, self.real(path), flags)

    def read(self, path, size, offset, fh):
        return passed(os.pread, fh, size, offset)

    def release(self, path, fh):
        return passed(os.close, fh)

    def flush(self, path, fh):
        return 0

    # Changing: refused while read-only.
    def create(self, path, mode, fi=None):
        refuse_when_read_only()
        # Read-write whatever the caller asked: the kernel may read through this handle too
        # (the pages of a file mapped into memory, as SQLite maps its `-shm`).
        return passed(os.open, self.real(path), os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)

    def write(self, path, data, offset, fh):
        refuse_when_read_only()
        return passed(os.pwrite, fh, data, offset)

    def truncate(self, path, length, fh=None):
        refuse_when_read_only()
        if fh is not None:
            return passed(os.ftruncate, fh, length)
        with open(self.real(path), "r+b") as f:
            f.truncate(length)

    def fsync(self, path, datasync, fh):
        refuse_when_read_only()
        return passed(os.fdatasync if datasync else os.fsync, fh)

    def unlink(self, path):
        refuse_when_read_only()
        return passed(os.unlink, self.real(path))

    def mkdir(self, path, mode):
        refuse_when_read_only()
        return passed(os.mkdir, self.real(path), mode)

    def rmdir(self, path):
        refuse_when_read_only()
        return passed(os.rmdir, self.real(path))

    def rename(self, old, new):
        refuse_when_read_only()
        return passed(os.rename, self.real(old), self.real(new))

    def chmod(self, path, mode):
        refuse_when_read_only()
        return passed(os.chmod, self.real(path), mode)

    def chown(self, path, uid, gid):
        refuse_when_read_only()
        return passed(os.chown, self.real(path), uid, gid)

    def utimens(self, path, times=None):
        refuse_when_read_only()
        return passed(os.utime, self.real(path), times)


if __name__ == "__main__":
    backing, mountpoint, control = sys.argv[1:4]
    threading.Thread(target=watch, args=(control,), daemon=True).start()
    # No attribute or entry caching: SQLite grows its `-shm` file and maps it, and a size the
    # kernel cached from before the growth makes the mapping fault (SIGBUS) past it.
    fuse.FUSE(
        Flaky(backing),
        mountpoint,
        foreground=True,
        nothreads=False,
        allow_other=True,
        attr_timeout=0,
        entry_timeout=0,
        negative_timeout=0,
    )
