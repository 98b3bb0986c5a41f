package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Checkpoint paths come from the job (its checkpoint.dir, its workers'
// reports, the names its workers create), but the agent that looks at them
// is root. Two rules keep that from lending the job root's view of the
// node:
//
//   - Paths are resolved beneath checkpoint.dir: openat2 with
//     RESOLVE_BENEATH refuses any symlink or ".." leading out of it (a
//     symlink that stays beneath is followed), and RESOLVE_NO_MAGICLINKS
//     refuses /proc's links to other processes' files. Kernels before 5.6
//     have no openat2; there a walk one name at a time refuses every
//     symlink instead.
//   - Everything is opened with the filesystem identity of the job's user
//     (its fsuid, fsgid and groups, on a thread of its own), so the kernel
//     applies that user's permissions: the agent learns no more than the
//     job's user could, and a directory that user cannot read answers
//     "permission denied" whether or not what was asked for exists. A mode
//     check on the final object alone would miss the directories above it
//     and ACLs.

// errOutside marks a path that leads out of checkpoint.dir.
var errOutside = errors.New("leads out of checkpoint.dir")

// dirFlags opens a directory the job's user must be able to list.
const dirFlags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC

// asUser runs f with cred's filesystem identity; nil cred is the agent's
// own user, which the job then runs as too.
func asUser(cred *syscall.Credential, f func() error) error {
	if cred == nil {
		return f()
	}
	done := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with this goroutine, so no other
		// goroutine ever runs with the job's identity and the agent's never
		// has to be restored.
		runtime.LockOSThread()
		if err := setFSIdentity(cred); err != nil {
			done <- err
			return
		}
		done <- f()
	}()
	return <-done
}

// setFSIdentity gives the calling thread cred's identity for file access,
// as exec gives it to the workers. x/sys/unix makes raw system calls, which
// change this thread only (syscall.Setgroups would change every thread).
func setFSIdentity(cred *syscall.Credential) error {
	if !cred.NoSetGroups {
		groups := make([]int, len(cred.Groups))
		for i, g := range cred.Groups {
			groups[i] = int(g)
		}
		if err := unix.Setgroups(groups); err != nil {
			return fmt.Errorf("taking the groups of the job's user: %w", err)
		}
	}
	// setfsuid and setfsgid never fail, they just keep the old id: read it
	// back (an invalid id, -1, changes nothing and returns the current one).
	_ = unix.Setfsgid(int(cred.Gid))
	_ = unix.Setfsuid(int(cred.Uid))
	gid, _ := unix.SetfsgidRetGid(-1)
	uid, _ := unix.SetfsuidRetUid(-1)
	if uid != int(cred.Uid) || gid != int(cred.Gid) {
		return fmt.Errorf("taking the identity of the job's user %d:%d for file access: got %d:%d", cred.Uid, cred.Gid, uid, gid)
	}
	return nil
}

// openBeneath opens the directory at rel, a clean relative path, beneath
// the directory dirfd. A symlink or ".." leading out fails with EXDEV.
func openBeneath(dirfd int, rel string) (int, error) {
	how := &unix.OpenHow{Flags: dirFlags, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS}
	for {
		fd, err := unix.Openat2(dirfd, rel, how)
		switch {
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
			// A rename or mount raced with the lookup.
			continue
		case errors.Is(err, unix.ENOSYS):
			return walkBeneath(dirfd, rel)
		}
		return fd, err
	}
}

// walkBeneath is openBeneath where openat2 is missing: one name at a time,
// none of which may be a symlink (ELOOP), since following one safely is
// exactly what openat2 is for.
func walkBeneath(dirfd int, rel string) (int, error) {
	fd := dirfd
	for _, name := range strings.Split(rel, "/") {
		if name == ".." {
			if fd != dirfd {
				unix.Close(fd)
			}
			return -1, unix.EXDEV
		}
		next, err := unix.Openat(fd, name, dirFlags|unix.O_NOFOLLOW, 0)
		if errors.Is(err, unix.ENOTDIR) {
			// O_DIRECTORY answers a symlink before O_NOFOLLOW does.
			var st unix.Stat_t
			if unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				err = unix.ELOOP
			}
		}
		if fd != dirfd {
			unix.Close(fd)
		}
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

// beneathError describes openBeneath's failure to open path.
func beneathError(path string, err error) error {
	switch {
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("path %q %w (through a symlink)", path, errOutside)
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("path %q: a symlink that is not followed here (too many levels, a /proc link, or a kernel without openat2, where none are): %w", path, err)
	}
	return &fs.PathError{Op: "checkpoint path", Path: path, Err: err}
}
