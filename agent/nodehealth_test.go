package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/rdzv/rdzv/health"
	"github.com/rdzv/rdzv/wire"
)

// sysfsTree writes files (path relative to the root: content) into a fake
// sysfs root.
func sysfsTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, []byte(content+"\n"), 0o644))
	}
	return root
}

func sysEth0(operstate, speed, mtu string) map[string]string {
	return map[string]string{
		"class/net/eth0/operstate": operstate, "class/net/eth0/speed": speed,
		"class/net/eth0/mtu": mtu, "class/net/eth0/flags": "0x1003",
	}
}

func with(m map[string]string, kv ...string) map[string]string {
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func TestNetworkCheck(t *testing.T) {
	strict := NetworkCheckConfig{SpeedMbps: 100000, MTU: 9000, InfiniBand: true}
	for _, tc := range []struct {
		name  string
		files map[string]string
		cfg   NetworkCheckConfig
		want  []string // substrings; none: the check passes
	}{
		{"up, nothing expected", sysEth0("up", "-1", "1500"), NetworkCheckConfig{}, nil},
		{"up at speed and mtu", sysEth0("up", "100000", "9000"), strict, nil},
		{"down", sysEth0("down", "100000", "9000"), strict, []string{"interface eth0 is down"}},
		{"lower layer down", sysEth0("lowerlayerdown", "100000", "9000"), NetworkCheckConfig{}, []string{"interface eth0 is lowerlayerdown"}},
		{"unknown operstate, administratively up", sysEth0("unknown", "100000", "9000"), strict, nil},
		{"unknown operstate, administratively down", with(sysEth0("unknown", "100000", "9000"), "class/net/eth0/flags", "0x1002"), strict,
			[]string{"interface eth0 is down (operstate unknown, flags 0x1002)"}},
		{"slow link", sysEth0("up", "25000", "9000"), strict, []string{"interface eth0 at 25000 Mb/s, expected 100000"}},
		{"no carrier speed", sysEth0("up", "-1", "9000"), strict, []string{"link speed unknown, expected 100000 Mb/s"}},
		{"wrong mtu", sysEth0("up", "100000", "1500"), strict, []string{"interface eth0 MTU 1500, expected 9000"}},
		{"missing interface", map[string]string{}, NetworkCheckConfig{}, []string{"interface eth0: open "}},
		{"infiniband ports active", with(sysEth0("up", "100000", "9000"),
			"class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE", "class/infiniband/mlx5_1/ports/1/state", "4: ACTIVE"), strict, nil},
		{"infiniband port down", with(sysEth0("up", "100000", "9000"),
			"class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE", "class/infiniband/mlx5_1/ports/1/state", "1: DOWN"), strict,
			[]string{"InfiniBand mlx5_1 port 1 is DOWN"}},
		{"infiniband not checked", with(sysEth0("up", "-1", "1500"), "class/infiniband/mlx5_1/ports/1/state", "2: INIT"), NetworkCheckConfig{}, nil},
		{"several problems", with(sysEth0("down", "10", "1500"), "class/infiniband/mlx5_0/ports/2/state", "2: INIT"), strict,
			[]string{"eth0 is down", "at 10 Mb/s", "MTU 1500", "InfiniBand mlx5_0 port 2 is INIT"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := networkCheck(sysfsTree(t, tc.files), "eth0", tc.cfg)
			if tc.want == nil {
				require.Empty(t, got)
			}
			for _, w := range tc.want {
				require.Contains(t, got, w)
			}
		})
	}
}

// fakeFS reports usage and devices from maps; a path missing from usage
// fails statfs.
type fakeFS struct {
	usage map[string][2]uint64 // free, total
	dev   map[string]uint64
}

var errNoSuchMount = errors.New("no such mount")

func (f fakeFS) Usage(p string) (uint64, uint64, error) {
	u, ok := f.usage[p]
	if !ok {
		return 0, 0, errNoSuchMount
	}
	return u[0], u[1], nil
}

func (f fakeFS) Device(p string) (uint64, error) {
	d, ok := f.dev[p]
	if !ok {
		return 0, errNoSuchMount
	}
	return d, nil
}

// A checkpoint root the agent unit's sandbox keeps read-only fails the
// storage check with the fix.
func TestStorageCheckReadOnly(t *testing.T) {
	ro := readOnlyDir(t)
	got := storageCheck(fakeFS{usage: map[string][2]uint64{ro: {10 << 30, 100 << 30}}}, StorageCheckConfig{Paths: []string{ro}})
	require.Contains(t, got, ro+": not writable: open ")
	require.Contains(t, got, "read-only file system; under systemd, list it in the agent unit's ReadWritePaths=")
	require.Contains(t, got, "add ReadWritePaths="+ro+", restart the agent")
}

func TestStorageCheck(t *testing.T) {
	ckpt, other := t.TempDir(), t.TempDir()
	missing := filepath.Join(ckpt, "missing")
	fs := fakeFS{
		usage: map[string][2]uint64{ckpt: {10 << 30, 100 << 30}, other: {1 << 20, 8 << 20}, missing: {10 << 30, 100 << 30}},
		dev:   map[string]uint64{"/": 1, ckpt: 2, other: 1},
	}
	for _, tc := range []struct {
		name string
		cfg  StorageCheckConfig
		want []string
	}{
		{"enough space", StorageCheckConfig{Paths: []string{ckpt}, MinFreeBytes: 1 << 30, MinFreePercent: 5}, nil},
		{"nothing required", StorageCheckConfig{Paths: []string{ckpt, other}}, nil},
		{"below bytes", StorageCheckConfig{Paths: []string{ckpt, other}, MinFreeBytes: 4 << 20},
			[]string{other + ": 1.0 MiB free of 8.0 MiB, below min_free_bytes 4.0 MiB"}},
		{"below percent", StorageCheckConfig{Paths: []string{ckpt}, MinFreePercent: 20},
			[]string{ckpt + ": 10.0% free (10.0 GiB of 100.0 GiB), below min_free_percent 20"}},
		{"mounted", StorageCheckConfig{Paths: []string{ckpt}, RequireMount: true}, nil},
		{"not mounted", StorageCheckConfig{Paths: []string{ckpt, other}, RequireMount: true},
			[]string{other + ": not mounted (on the root filesystem)"}},
		{"statfs fails", StorageCheckConfig{Paths: []string{"/nowhere"}}, []string{"no such mount"}},
		{"not writable", StorageCheckConfig{Paths: []string{missing}}, []string{missing + ": not writable: open "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := storageCheck(fs, tc.cfg)
			if tc.want == nil {
				require.Empty(t, got)
			}
			for _, w := range tc.want {
				require.Contains(t, got, w)
			}
			entries, err := os.ReadDir(ckpt)
			require.NoError(t, err)
			require.Empty(t, entries, "the write probe cleans up")
		})
	}
}

func TestCommandCheck(t *testing.T) {
	sh := func(script string) CommandCheck {
		return CommandCheck{Name: "op", Path: "/bin/sh", Args: []string{"-c", script}}
	}
	for _, tc := range []struct {
		name string
		cmd  CommandCheck
		want string
	}{
		{"passes", sh("exit 0"), ""},
		{"clean environment", sh(`test -z "$HOME" && test "$PATH" = /usr/bin:/bin`), ""},
		{"fails with stderr", sh("echo one >&2; echo two >&2; echo 3 >&2; echo 4 >&2; echo 5 >&2; echo six >&2; exit 3"),
			"exit status 3: one\ntwo\n3\n4\n5"},
		{"fails silently", sh("echo only stdout; exit 1"), "exit status 1"},
		{"missing program", CommandCheck{Name: "op", Path: "/nonexistent/check"}, "no such file or directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := commandCheck(context.Background(), tc.cmd, nil, "/usr/bin:/bin")
			if tc.want == "" {
				require.Empty(t, got)
			} else {
				require.Contains(t, got, tc.want)
				require.NotContains(t, got, "six")
			}
		})
	}
}

func TestCommandCheckTimeoutKillsGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	// The grandchild would outlive a kill of the shell alone.
	cmd := CommandCheck{Name: "op", Path: "/bin/sh", Args: []string{"-c", "sleep 600 & echo $! > " + pidFile + "; wait"}}
	unit := checkUnit{checks: []health.Check{{Name: "op"}}, timeout: 200 * time.Millisecond,
		run: func(ctx context.Context) []string { return []string{commandCheck(ctx, cmd, nil, "/usr/bin:/bin")} }}
	got := runUnit(context.Background(), unit)
	require.Contains(t, got[0], "no verdict")
	b, err := os.ReadFile(pidFile)
	require.NoError(t, err)
	pid := strings.TrimSpace(string(b))
	require.Eventually(t, func() bool {
		_, err := os.Stat("/proc/" + pid)
		return err != nil
	}, waitTimeout, 10*time.Millisecond, "the check's whole process group is killed")
}

func TestCommandCheckRunAs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run checks as another user")
	}
	cfg := DefaultConfig()
	cfg.Controller, cfg.Insecure = "127.0.0.1:1", true
	cfg.HealthChecks.RunAs = "nobody"
	cfg.HealthChecks.Commands = []CommandCheck{{Name: "whoami", Path: "/bin/sh", Args: []string{"-c", `u=$(id -u); [ "$u" = 65534 ] || { echo "ran as $u" >&2; exit 1; }`}}}
	h, err := NewNodeHealth(cfg, HealthEnv{SysfsRoot: sysfsTree(t, sysEth0("up", "1000", "1500")), Interface: "eth0", Clock: clockwork.NewFakeClock()}, zaptest.NewLogger(t))
	require.NoError(t, err)
	for _, c := range h.Run(context.Background()) {
		require.True(t, c.OK, "%s: %s", c.Name, c.Message)
	}
}

// fakeGPUs is a GPUStateReader whose GPUs tests break and mend.
type fakeGPUs struct {
	mu     sync.Mutex
	states []health.GPUState
	err    error
}

func (f *fakeGPUs) States(context.Context) ([]health.GPUState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]health.GPUState(nil), f.states...), f.err
}

func (f *fakeGPUs) set(states []health.GPUState, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.states, f.err = states, err
}

func byName(checks []health.Check) map[string]health.Check {
	m := map[string]health.Check{}
	for _, c := range checks {
		m[c.Name] = c
	}
	return m
}

func TestNodeHealthVerdicts(t *testing.T) {
	clock := clockwork.NewFakeClock()
	healthy := []health.GPUState{{Index: 0, UUID: "GPU-a"}, {Index: 1, UUID: "GPU-b"}}
	gpus := &fakeGPUs{states: healthy}
	ckpt := t.TempDir()
	flag := filepath.Join(t.TempDir(), "drain")
	cfg := DefaultConfig()
	cfg.Controller, cfg.Insecure = "127.0.0.1:1", true
	cfg.HealthChecks.Storage = StorageCheckConfig{Paths: []string{ckpt}, MinFreeBytes: 1 << 20}
	cfg.HealthChecks.Commands = []CommandCheck{{Name: "drain-flag", Path: "/bin/sh", Args: []string{"-c", "test ! -e " + flag}}}
	fs := fakeFS{usage: map[string][2]uint64{ckpt: {1 << 30, 2 << 30}}}
	h, err := NewNodeHealth(cfg, HealthEnv{
		SysfsRoot: sysfsTree(t, sysEth0("up", "1000", "1500")), FS: fs, GPUs: gpus, Interface: "eth0",
		DiscoveredGPUs: 2, Clock: clock,
	}, zaptest.NewLogger(t))
	require.NoError(t, err)

	before := byName(h.Results())
	require.Len(t, before, 5)
	require.False(t, before[checkGPU].OK, "nothing passes before the first run")

	t0 := clock.Now()
	got := byName(h.Run(context.Background()))
	for name, c := range got {
		require.True(t, c.OK, "%s: %s", name, c.Message)
		require.Equal(t, t0, c.Since)
	}
	require.True(t, got[checkGPU].Critical)
	require.False(t, got[checkGPUPerformance].Critical)
	require.Len(t, h.Changed(), 1, "the first verdicts are news")
	<-h.Changed()
	require.NoError(t, h.Gate(context.Background()))
	require.Empty(t, h.Changed(), "the same verdicts again are not")

	clock.Advance(time.Minute)
	t1 := clock.Now()
	gpus.set(healthy[:1], nil)
	require.NoError(t, os.WriteFile(flag, nil, 0o644))
	err = h.Gate(context.Background())
	require.ErrorIs(t, err, errUnhealthy)
	require.Contains(t, err.Error(), "gpu: 1 GPUs present, expected 2")
	require.Contains(t, err.Error(), "drain-flag: exit status 1")
	require.Len(t, h.Changed(), 1)
	<-h.Changed()
	got = byName(h.Results())
	require.False(t, got[checkGPU].OK)
	require.Equal(t, t1, got[checkGPU].Since)
	require.True(t, got[checkStorage].OK)
	require.Equal(t, t0, got[checkStorage].Since, "an unchanged verdict keeps its since")
	stop, why := health.StopsRunningJob(h.Results())
	require.True(t, stop, "a missing GPU is critical")
	require.Contains(t, why, "gpu: ")

	clock.Advance(time.Minute)
	gpus.set(healthy, nil)
	require.NoError(t, os.Remove(flag))
	got = byName(h.Run(context.Background()))
	for name, c := range got {
		require.True(t, c.OK, "%s: %s", name, c.Message)
	}
	require.Equal(t, clock.Now(), got[checkGPU].Since, "passing again moves since")
	require.Equal(t, clock.Now(), got["drain-flag"].Since)

	gpus.set(nil, errors.New("driver gone"))
	got = byName(h.Run(context.Background()))
	require.Equal(t, "reading GPU state: driver gone", got[checkGPU].Message)
	require.True(t, got[checkGPUPerformance].OK)
}

func TestNodeHealthWhichChecks(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Controller, cfg.Insecure = "127.0.0.1:1", true
	env := HealthEnv{SysfsRoot: sysfsTree(t, sysEth0("up", "1000", "1500")), Interface: "eth0", Clock: clockwork.NewFakeClock(), GPUs: &fakeGPUs{}}
	names := func(cfg Config, env HealthEnv) []string {
		h, err := NewNodeHealth(cfg, env, zaptest.NewLogger(t))
		require.NoError(t, err)
		var out []string
		for _, c := range h.Results() {
			out = append(out, c.Name)
		}
		return out
	}
	require.Equal(t, []string{checkNetwork}, names(cfg, env), "a CPU node has no gpu checks, no paths no storage check")
	env.DiscoveredGPUs = 8
	require.Equal(t, []string{checkGPU, checkGPUPerformance, checkNetwork}, names(cfg, env))
	env.DiscoveredGPUs, cfg.HealthChecks.GPU.ExpectedCount = 0, 8
	require.Equal(t, []string{checkGPU, checkGPUPerformance, checkNetwork}, names(cfg, env), "GPUs expected but none found")
	env.GPUs = nil
	require.Equal(t, []string{checkNetwork}, names(cfg, env), "no GPU state reader")
}

func TestHealthChecksValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*HealthChecksConfig)
		want   string
	}{
		{"defaults", func(*HealthChecksConfig) {}, ""},
		{"interval", func(h *HealthChecksConfig) { h.Interval = wire.Duration{} }, "health_checks.interval: must be positive, got 0s"},
		{"timeout", func(h *HealthChecksConfig) { h.Timeout = wire.Duration{Duration: -time.Second} }, "health_checks.timeout: must be positive, got -1s"},
		{"expected count", func(h *HealthChecksConfig) { h.GPU.ExpectedCount = -1 }, "health_checks.gpu.expected_count: must be between 0"},
		{"speed", func(h *HealthChecksConfig) { h.Network.SpeedMbps = -5 }, "health_checks.network.speed_mbps: must be 0 (not checked) or more, got -5"},
		{"mtu", func(h *HealthChecksConfig) { h.Network.MTU = 100000 }, "health_checks.network.mtu: must be 0 (not checked) or an MTU up to 65536, got 100000"},
		{"relative path", func(h *HealthChecksConfig) { h.Storage.Paths = []string{"ckpt"} }, "health_checks.storage.paths[0]"},
		{"percent", func(h *HealthChecksConfig) { h.Storage.MinFreePercent = 100 }, "health_checks.storage.min_free_percent: must be at least 0 and below 100, got 100"},
		{"command name", func(h *HealthChecksConfig) { h.Commands = []CommandCheck{{Name: "Bad_Name", Path: "/bin/true"}} }, "health_checks.commands[0].name"},
		{"built-in name", func(h *HealthChecksConfig) { h.Commands = []CommandCheck{{Name: "storage", Path: "/bin/true"}} },
			`health_checks.commands[0].name: "storage" is taken by a built-in or an earlier command`},
		{"duplicate name", func(h *HealthChecksConfig) {
			h.Commands = []CommandCheck{{Name: "ib", Path: "/bin/true"}, {Name: "ib", Path: "/bin/true"}}
		}, `health_checks.commands[1].name: "ib" is taken`},
		{"command path", func(h *HealthChecksConfig) { h.Commands = []CommandCheck{{Name: "ib", Path: "true"}} }, "health_checks.commands[0].path"},
		{"command timeout", func(h *HealthChecksConfig) {
			h.Commands = []CommandCheck{{Name: "ib", Path: "/bin/true", Timeout: wire.Duration{Duration: -1}}}
		}, "health_checks.commands[0].timeout: must be 0 (health_checks.timeout) or positive"},
		{"run_as", func(h *HealthChecksConfig) { h.RunAs = "a b" }, "health_checks.run_as"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := DefaultHealthChecks()
			tc.change(&h)
			err := h.Validate("health_checks")
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
		})
	}
}
