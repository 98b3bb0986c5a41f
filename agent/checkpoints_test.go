package agent

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rdzv/rdzv/jobspec"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// makeTree creates paths under dir: directories where the path ends in "/",
// else empty files (markers count at any size).
func makeTree(t *testing.T, dir string, paths ...string) {
	t.Helper()
	for _, p := range paths {
		full := filepath.Join(dir, p)
		if strings.HasSuffix(p, "/") {
			require.NoError(t, os.MkdirAll(full, 0o755))
			continue
		}
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, nil, 0o644))
	}
}

func TestScanCheckpoints(t *testing.T) {
	tests := []struct {
		name    string
		tree    []string
		outside []string
		// links maps a name in dir to its target; "OUT/" starts a target in
		// a directory beside dir.
		links   map[string]string
		markers []string
		want    []FoundCheckpoint // paths relative to dir
	}{
		{name: "hugging face layout", tree: []string{"checkpoint-500/trainer_state.json", "checkpoint-500/model.safetensors"},
			want: []FoundCheckpoint{{500, "checkpoint-500"}}},
		{name: "torch.distributed.checkpoint layout", tree: []string{"step-10/.metadata", "step-10/__0_0.distcp"},
			want: []FoundCheckpoint{{10, "step-10"}}},
		{name: "example layout", tree: []string{"step-20/COMPLETE", "step-20/model.pt"},
			want: []FoundCheckpoint{{20, "step-20"}}},
		{name: "torn checkpoint without marker", tree: []string{"step-30/model.pt", "step-31/"}},
		{name: "temporary directory being built", tree: []string{".step-40.tmp-9/COMPLETE", ".40/COMPLETE"}},
		{name: "names without a trailing number", tree: []string{"latest/COMPLETE", "step-/COMPLETE", "best-model/COMPLETE", "step-40.bak/COMPLETE"}},
		{name: "any trailing number", tree: []string{"40/COMPLETE", "global_step300/.metadata", "run-2-step007/COMPLETE"},
			want: []FoundCheckpoint{{7, "run-2-step007"}, {40, "40"}, {300, "global_step300"}}},
		{name: "step beyond uint64", tree: []string{"step-99999999999999999999/COMPLETE"}},
		{name: "marker must be a file", tree: []string{"step-50/COMPLETE/"}},
		{name: "step must be a directory", tree: []string{"step-60"}},
		{name: "custom markers replace the defaults", tree: []string{"step-1/DONE", "step-2/COMPLETE", "step-3/.done"},
			markers: []string{"DONE", ".done"},
			want:    []FoundCheckpoint{{1, "step-1"}, {3, "step-3"}}},
		{name: "no markers, nothing complete", tree: []string{"step-1/COMPLETE"}, markers: []string{}},
		{name: "sorted by step, not name", tree: []string{"step-100/COMPLETE", "step-9/COMPLETE", "checkpoint-20/trainer_state.json", "step-20/COMPLETE", "global_step3/.metadata"},
			want: []FoundCheckpoint{{3, "global_step3"}, {9, "step-9"}, {20, "checkpoint-20"}, {20, "step-20"}, {100, "step-100"}}},
		{name: "symlink to a step inside", tree: []string{".real/COMPLETE"}, links: map[string]string{"step-70": ".real"},
			want: []FoundCheckpoint{{70, "step-70"}}},
		{name: "symlink leading outside", outside: []string{"step-80/COMPLETE"}, links: map[string]string{"step-80": "OUT/step-80"}},
		{name: "relative symlink leading outside", outside: []string{"step-81/COMPLETE"}, links: map[string]string{"step-81": "../out/step-81"}},
		{name: "symlink out and back in", tree: []string{"step-82/COMPLETE"}, links: map[string]string{"step-83": "../ckpt/step-82"},
			want: []FoundCheckpoint{{82, "step-82"}}},
		{name: "symlink to /root", links: map[string]string{"step-84": "/root"}},
		{name: "marker symlinked from outside", outside: []string{"COMPLETE"}, tree: []string{"step-85/"}, links: map[string]string{"step-85/COMPLETE": "OUT/COMPLETE"}},
		{name: "dangling symlink", links: map[string]string{"step-90": ".gone"}},
		{name: "empty directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			dir, out := filepath.Join(root, "ckpt"), filepath.Join(root, "out")
			require.NoError(t, os.Mkdir(dir, 0o755))
			makeTree(t, dir, tt.tree...)
			makeTree(t, out, tt.outside...)
			for name, target := range tt.links {
				if rest, ok := strings.CutPrefix(target, "OUT/"); ok {
					target = filepath.Join(out, rest)
				}
				require.NoError(t, os.Symlink(target, filepath.Join(dir, name)))
			}
			markers := tt.markers
			if markers == nil {
				markers = jobspec.DefaultMarkers
			}
			got, err := ScanCheckpoints(dir, markers, nil)
			require.NoError(t, err)
			var want []FoundCheckpoint
			for _, c := range tt.want {
				want = append(want, FoundCheckpoint{Step: c.Step, Path: filepath.Join(dir, c.Path)})
			}
			require.Equal(t, want, got)
		})
	}
}

func TestScanCheckpointsMissingDir(t *testing.T) {
	_, err := ScanCheckpoints(filepath.Join(t.TempDir(), "nope"), jobspec.DefaultMarkers, nil)
	require.ErrorIs(t, err, fs.ErrNotExist, "the scanner tells a missing directory from a broken one")
}

// TestScanCheckpointsAsJobUser scans as an unprivileged job user: what that
// user cannot read is not found, so it never shows in the job's events.
func TestScanCheckpointsAsJobUser(t *testing.T) {
	needRoot(t)
	dir := filepath.Join(t.TempDir(), "ckpt")
	makeTree(t, dir, "step-1/COMPLETE", "step-2/COMPLETE", "step-3/COMPLETE", "private/step-4/COMPLETE")
	openToAll(t, dir)
	require.NoError(t, os.Symlink("private/step-4", filepath.Join(dir, "step-4")))
	require.NoError(t, os.Chmod(filepath.Join(dir, "step-2"), 0o700))
	require.NoError(t, os.Chmod(filepath.Join(dir, "step-3"), 0o311))
	require.NoError(t, os.Chmod(filepath.Join(dir, "private"), 0o700))

	got, err := ScanCheckpoints(dir, jobspec.DefaultMarkers, nobody)
	require.NoError(t, err)
	require.Equal(t, []FoundCheckpoint{{1, filepath.Join(dir, "step-1")}}, got)
	got, err = ScanCheckpoints(dir, jobspec.DefaultMarkers, nil)
	require.NoError(t, err)
	require.Len(t, got, 4, "the agent's own user sees them all")

	require.NoError(t, os.Chmod(dir, 0o700))
	_, err = ScanCheckpoints(dir, jobspec.DefaultMarkers, nobody)
	require.ErrorIs(t, err, fs.ErrPermission)
}

// TestOpenBeneath runs both ways of resolving beneath a directory: openat2,
// and the walk for kernels without it, which follows no symlink at all.
func TestOpenBeneath(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "ckpt")
	makeTree(t, root, "ckpt/a/b/", "ckpt/file", "out/x/")
	for link, target := range map[string]string{
		"ckpt/in":      "a/b",
		"ckpt/a/up":    "../a",
		"ckpt/abs":     filepath.Join(root, "out"),
		"ckpt/rel":     "../out",
		"ckpt/a/back":  "../../ckpt/a",
		"ckpt/a/b/mid": "../../../out",
	} {
		require.NoError(t, os.Symlink(target, filepath.Join(root, link)))
	}
	base, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(base)

	tests := []struct {
		rel string
		// wantAt2 and wantWalk are the errors of openat2 and of the walk.
		wantAt2, wantWalk error
	}{
		{"a", nil, nil},
		{"a/b", nil, nil},
		{"in", nil, unix.ELOOP},
		{"a/up/b", nil, unix.ELOOP},
		{"abs", unix.EXDEV, unix.ELOOP},
		{"abs/x", unix.EXDEV, unix.ELOOP},
		{"rel", unix.EXDEV, unix.ELOOP},
		{"a/back", unix.EXDEV, unix.ELOOP},
		{"a/b/mid/x", unix.EXDEV, unix.ELOOP},
		{"..", unix.EXDEV, unix.EXDEV},
		{"a/../../out", unix.EXDEV, unix.EXDEV},
		{"file", unix.ENOTDIR, unix.ENOTDIR},
		{"nope", unix.ENOENT, unix.ENOENT},
	}
	for _, tt := range tests {
		for _, opener := range []struct {
			name string
			open func(int, string) (int, error)
			want error
		}{{"openat2", openBeneath, tt.wantAt2}, {"walk", walkBeneath, tt.wantWalk}} {
			t.Run(opener.name+" "+tt.rel, func(t *testing.T) {
				fd, err := opener.open(base, tt.rel)
				if opener.want != nil {
					require.ErrorIs(t, err, opener.want)
					return
				}
				require.NoError(t, err)
				require.NoError(t, unix.Close(fd))
			})
		}
	}
}

// nextCheckpoint is the supervisor's next checkpoint report.
func (h *supHarness) nextCheckpoint() *rdzvv1.CheckpointReport {
	h.t.Helper()
	select {
	case r := <-h.sup.Checkpoints():
		return r
	case <-time.After(waitTimeout):
		require.FailNow(h.t, "no checkpoint report")
		return nil
	}
}

// queuedCheckpoints takes the checkpoint reports queued now.
func (h *supHarness) queuedCheckpoints() []*rdzvv1.CheckpointReport {
	var out []*rdzvv1.CheckpointReport
	for {
		select {
		case r := <-h.sup.Checkpoints():
			out = append(out, r)
		default:
			return out
		}
	}
}

func TestSupervisorScansWhileRunning(t *testing.T) {
	h := newSupervisor(t)
	dir := t.TempDir()
	// Generation 3 resumes from step 5: the controller has nothing older.
	makeTree(t, dir, "step-4/COMPLETE", "step-5/COMPLETE", "step-10/COMPLETE")
	a := h.assignment("train", 3, "hang")
	a.NodeRank, a.Spec.CheckpointDir = 0, dir
	a.ResumeFrom, a.ResumeStep = filepath.Join(dir, "step-5"), 5
	h.sup.Assign(a)
	h.expect("train", 3, wRunning)

	scan := func(step uint64, name string) *rdzvv1.CheckpointReport {
		return &rdzvv1.CheckpointReport{Job: "train", Generation: 3, Step: step, Path: filepath.Join(dir, name), Source: "scan"}
	}
	requireProto(t, scan(10, "step-10"), h.nextCheckpoint(), "checkpoints of earlier generations newer than the resumed one are offered too")
	makeTree(t, dir, "step-20/.metadata")
	requireProto(t, scan(20, "step-20"), h.nextCheckpoint())

	makeTree(t, dir, "step-30/model.pt", ".step-40.tmp-1/COMPLETE")
	h.sup.Stop("train", 3, "done")
	h.expect("train", 3, wStopped)
	require.Empty(t, h.queuedCheckpoints(), "each checkpoint is reported once, and a torn one never")
}

// TestSupervisorScansAfterExit saves a checkpoint no periodic scan sees:
// the scan after the exit finds it, and queues it before the exit's status.
func TestSupervisorScansAfterExit(t *testing.T) {
	h := newSupervisor(t)
	h.sup.scanEvery = time.Hour
	dir := t.TempDir()
	a := h.assignment("train", 1, "hang")
	a.NodeRank, a.Spec.CheckpointDir = 0, dir
	h.sup.Assign(a)
	h.expect("train", 1, wRunning)
	makeTree(t, dir, "step-5/COMPLETE")
	h.sup.Stop("train", 1, "node lost")
	h.expect("train", 1, wStopped)
	requireProto(t, []*rdzvv1.CheckpointReport{
		{Job: "train", Generation: 1, Step: 5, Path: filepath.Join(dir, "step-5"), Source: "scan"},
	}, h.queuedCheckpoints())
}

func TestSupervisorScansOnlyOnRankZero(t *testing.T) {
	tests := []struct {
		name     string
		nodeRank uint32
		withDir  bool
	}{
		{"other ranks leave the shared directory to rank 0", 1, true},
		{"no checkpoint directory", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newSupervisor(t)
			dir := t.TempDir()
			makeTree(t, dir, "step-10/COMPLETE")
			a := h.assignment("train", 1, "ok")
			a.NodeRank = tt.nodeRank
			if tt.withDir {
				a.Spec.CheckpointDir = dir
			}
			h.sup.Assign(a)
			h.expect("train", 1, wRunning)
			h.expect("train", 1, wSucceeded)
			require.Empty(t, h.queuedCheckpoints())
		})
	}
}

func TestSupervisorScanSkipsHelperReports(t *testing.T) {
	h := newSupervisor(t)
	h.sup.scanEvery = time.Hour
	dir := t.TempDir()
	a := h.assignment("train", 1, "hang")
	a.NodeRank, a.Spec.CheckpointDir = 0, dir
	h.sup.Assign(a)
	h.expect("train", 1, wRunning)
	// The scan loop's first pass may run at any moment: until the helper
	// has reported it, the checkpoint is still being written (no marker),
	// so only the helper's report can be queued for it.
	makeTree(t, dir, "step-7/model.pt")
	path := filepath.Join(dir, "step-7")
	require.NoError(t, h.sup.reportCheckpoint(h.token(), "train", 1, 7, path, time.Now()))
	makeTree(t, dir, "step-7/COMPLETE")
	h.sup.Stop("train", 1, "done")
	h.expect("train", 1, wStopped)
	requireProto(t, []*rdzvv1.CheckpointReport{
		{Job: "train", Generation: 1, Step: 7, Path: path, Source: "helper"},
	}, h.queuedCheckpoints(), "the scan after the exit does not repeat what the workers reported")
}
