package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rdzv/rdzv/wire"
)

// readOnlyDir is a directory on a tmpfs mounted read-only, as a
// checkpoint.dir outside the agent unit's ReadWritePaths= is to the agent
// and its workers under ProtectSystem=strict. It needs root.
func readOnlyDir(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a read-only tmpfs needs root")
	}
	dir := t.TempDir()
	// Writable to all but for the mount, and reachable: only EROFS is left
	// to refuse the job's user.
	require.NoError(t, os.Chmod(filepath.Dir(dir), 0o755))
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "size=1m,mode=1777"); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { require.NoError(t, unix.Unmount(dir, unix.MNT_DETACH)) })
	return dir
}

// rootOnlyDir is a directory only root may write in.
func rootOnlyDir(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("taking another user's identity needs root")
	}
	dir := filepath.Join(t.TempDir(), "ckpt")
	require.NoError(t, os.Mkdir(dir, 0o755))
	// t.TempDir is 0700: the job's user must reach dir to be refused by it.
	require.NoError(t, os.Chmod(filepath.Dir(dir), 0o755))
	return dir
}

func TestProbeWrite(t *testing.T) {
	nobody := &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{65534}}
	tests := []struct {
		name string
		dir  func(t *testing.T) string
		cred *syscall.Credential
		want error
	}{
		{"writable", func(t *testing.T) string { return t.TempDir() }, nil, nil},
		{"read-only mount", readOnlyDir, nil, syscall.EROFS},
		{"read-only mount, job's user", readOnlyDir, nobody, syscall.EROFS},
		{"another user's directory", rootOnlyDir, nobody, syscall.EACCES},
		{"the owner", rootOnlyDir, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := tt.dir(t)
			err := probeWrite(dir, tt.cred)
			if tt.want == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tt.want)
			}
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			require.Empty(t, entries, "the probe leaves nothing behind")
		})
	}
}

// Each refusal names the directory, the errno and the fix.
func TestNotWritable(t *testing.T) {
	cred := &syscall.Credential{Uid: 61200, Gid: 61200}
	pathErr := func(errno syscall.Errno) error {
		return &os.PathError{Op: "open", Path: "/shared/ckpt/.rdzv-write-probe-1", Err: errno}
	}
	tests := []struct {
		name        string
		dir, target string
		cred        *syscall.Credential
		err         error
		want        string
	}{
		{"sandbox", "/shared/ckpt", "/shared/ckpt", cred, pathErr(syscall.EROFS),
			"checkpoint.dir /shared/ckpt is read-only on node n1 (EROFS: open /shared/ckpt/.rdzv-write-probe-1: read-only file system); under systemd, list it in the agent unit's ReadWritePaths= " +
				"(ProtectSystem=strict makes every path not listed read-only to the agent and its workers: systemctl edit rdzv-agent, add ReadWritePaths=/shared/ckpt, restart the agent), otherwise mount it read-write"},
		{"parent in the sandbox", "/shared/ckpt/run1", "/shared/ckpt", nil, pathErr(syscall.EROFS),
			"the parent /shared/ckpt of checkpoint.dir /shared/ckpt/run1 (which the job would create) is read-only on node n1 (EROFS: "},
		{"permissions", "/shared/ckpt", "/shared/ckpt", cred, pathErr(syscall.EACCES),
			"checkpoint.dir /shared/ckpt is not writable by the job's user 61200:61200 on node n1 (EACCES: open /shared/ckpt/.rdzv-write-probe-1: permission denied); give that user write access (chown, chmod or an ACL), or run the job as a user who has it (run_as)"},
		{"other", "/shared/ckpt", "/shared/ckpt", nil, pathErr(syscall.ENOSPC),
			"checkpoint.dir /shared/ckpt: the agent's user cannot create a file in it on node n1: open /shared/ckpt/.rdzv-write-probe-1: no space left on device"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := notWritable(tt.dir, tt.target, "n1", tt.cred, tt.err)
			require.ErrorContains(t, err, tt.want)
			var errno syscall.Errno
			require.True(t, errors.As(err, &errno), "the errno stays inspectable")
		})
	}
}

// A job whose workers cannot write its checkpoint.dir fails before they
// start, with a class the controller does not restart into a crash loop.
func TestSupervisorRefusesUnwritableCheckpointDir(t *testing.T) {
	tests := []struct {
		name  string
		dir   func(t *testing.T) string
		runAs string
		want  []string
	}{
		{"read-only", readOnlyDir, "", []string{"is read-only on node node-a (EROFS", "ReadWritePaths="}},
		{"not created yet, parent read-only", func(t *testing.T) string { return filepath.Join(readOnlyDir(t), "run1") }, "",
			[]string{"of checkpoint.dir", "(which the job would create) is read-only on node node-a (EROFS"}},
		{"another user's", rootOnlyDir, "65534:65534", []string{"is not writable by the job's user 65534:65534 on node node-a (EACCES"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := tt.dir(t)
			h := newSupervisor(t, func(c *Config) {
				if tt.runAs != "" {
					c.RunAs = tt.runAs
				}
			})
			a := h.assignment("train", 1, "ok")
			a.Spec.CheckpointDir = dir
			h.sup.Assign(a)
			st := h.expect("train", 1, wFailed)
			require.Equal(t, wire.FailureCheckpointDirNotWritable, st.GetFailure())
			require.Contains(t, st.GetMessage(), fmt.Sprintf("%s: ", wire.FailureCheckpointDirNotWritable))
			for _, m := range tt.want {
				require.Contains(t, st.GetMessage(), m)
			}
			require.Nil(t, st.GetExitedAt(), "nothing ran")
			require.False(t, h.sup.Running("train"))
		})
	}
}
