package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/health"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// GPUStateReader reads what the gpu health checks judge of each GPU
// (NVML in production).
type GPUStateReader interface {
	States(ctx context.Context) ([]health.GPUState, error)
}

// FSInfo is what the storage check asks of the filesystem (statfs and
// stat in production, a fake in tests).
type FSInfo interface {
	// Usage is the space free to unprivileged users and the filesystem's
	// size, in bytes.
	Usage(path string) (free, total uint64, err error)
	// Device is the device number of the filesystem path lies on.
	Device(path string) (uint64, error)
}

// SystemFS is FSInfo of this machine.
type SystemFS struct{}

// Usage calls statfs(2).
func (SystemFS) Usage(path string) (free, total uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", path, err)
	}
	return st.Bavail * uint64(st.Bsize), st.Blocks * uint64(st.Bsize), nil
}

// Device calls stat(2).
func (SystemFS) Device(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return st.Dev, nil
}

// HealthEnv is what the built-in checks read, injected so that tests use
// fake sysfs trees, filesystems and GPUs.
type HealthEnv struct {
	// SysfsRoot is where sysfs is mounted ("/sys").
	SysfsRoot string
	FS        FSInfo
	// GPUs is nil on a node without a GPU state reader.
	GPUs GPUStateReader
	// Interface is the chosen NCCL interface.
	Interface string
	// DiscoveredGPUs is how many GPUs the agent found at start: the gpu
	// check's expected count unless configured.
	DiscoveredGPUs int
	Clock          clockwork.Clock
}

// checkUnit runs one or more checks that share their work (one NVML pass
// judges both gpu checks): run returns one message per check, empty when
// it passes.
type checkUnit struct {
	checks  []health.Check // Name and Critical only
	timeout time.Duration
	run     func(ctx context.Context) []string
}

// NodeHealth runs the node health checks and keeps their verdicts.
type NodeHealth struct {
	units    []checkUnit
	interval time.Duration
	clock    clockwork.Clock
	log      *zap.Logger
	// runMu makes runs take turns: the periodic one and a pre-start one.
	runMu sync.Mutex

	mu      sync.Mutex
	results []health.Check
	changed chan struct{}
}

// NewNodeHealth builds the configured checks. The gpu checks exist on a
// node with GPUs (found or expected), the network check always, the
// storage check when it has paths.
func NewNodeHealth(cfg Config, env HealthEnv, log *zap.Logger) (*NodeHealth, error) {
	hc := cfg.HealthChecks
	h := &NodeHealth{interval: hc.Interval.Duration, clock: env.Clock, log: log, changed: make(chan struct{}, 1)}
	timeout := hc.Timeout.Duration
	expected := hc.GPU.ExpectedCount
	if expected == 0 {
		expected = env.DiscoveredGPUs
	}
	if env.GPUs != nil && expected > 0 {
		policy := health.GPUPolicy{ExpectedCount: expected, MaxTemperatureC: hc.GPU.MaxTemperatureC, RequirePersistence: hc.GPU.PersistenceMode}
		h.units = append(h.units, checkUnit{
			checks:  []health.Check{{Name: checkGPU, Critical: true}, {Name: checkGPUPerformance}},
			timeout: timeout,
			run:     func(ctx context.Context) []string { return gpuCheck(ctx, env.GPUs, policy) },
		})
	}
	h.units = append(h.units, checkUnit{
		checks:  []health.Check{{Name: checkNetwork}},
		timeout: timeout,
		run: func(context.Context) []string {
			return []string{networkCheck(env.SysfsRoot, env.Interface, hc.Network)}
		},
	})
	if len(hc.Storage.Paths) > 0 {
		h.units = append(h.units, checkUnit{
			checks:  []health.Check{{Name: checkStorage}},
			timeout: timeout,
			run:     func(context.Context) []string { return []string{storageCheck(env.FS, hc.Storage)} },
		})
	}
	var cred *syscall.Credential
	if hc.RunAs != "" {
		runAs, err := ResolveRunAs("", hc.RunAs, false, cfg.RunAsPolicy)
		if err != nil {
			return nil, fmt.Errorf("health_checks.run_as: %w", err)
		}
		cred = runAs.Credential
	}
	for _, c := range hc.Commands {
		t := c.Timeout.Duration
		if t == 0 {
			t = timeout
		}
		h.units = append(h.units, checkUnit{
			checks:  []health.Check{{Name: c.Name, Critical: c.Critical}},
			timeout: t,
			run: func(ctx context.Context) []string {
				return []string{commandCheck(ctx, c, cred, cfg.WorkerPath)}
			},
		})
	}
	for _, u := range h.units {
		for _, c := range u.checks {
			c.Message = "not run yet"
			h.results = append(h.results, c)
		}
	}
	return h, nil
}

// Changed is signalled when a verdict changed since the last Results.
func (h *NodeHealth) Changed() <-chan struct{} { return h.changed }

// Results are the latest verdicts; before the first Run every check fails
// with "not run yet" (the agent runs them before it registers).
func (h *NodeHealth) Results() []health.Check {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.results)
}

// Run runs every check at once, each bounded by its timeout, and folds the
// outcomes into the verdicts.
func (h *NodeHealth) Run(ctx context.Context) []health.Check {
	h.runMu.Lock()
	defer h.runMu.Unlock()
	msgs := make([][]string, len(h.units))
	var wg sync.WaitGroup
	for i, u := range h.units {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msgs[i] = runUnit(ctx, u)
		}()
	}
	wg.Wait()
	now := h.clock.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	changed := false
	k := 0
	for i, u := range h.units {
		for j := range u.checks {
			prev := h.results[k]
			msg := wire.ClipText(msgs[i][j])
			next := prev.Next(msg == "", msg, now)
			if prev.Since.IsZero() || next.OK != prev.OK || next.Message != prev.Message {
				changed = true
			}
			if next.OK != prev.OK || prev.Since.IsZero() {
				if next.OK {
					h.log.Info("node health check passing", zap.String("check", next.Name))
				} else {
					h.log.Warn("node health check failing", zap.String("check", next.Name), zap.Bool("critical", next.Critical), zap.String("reason", next.Message))
				}
			}
			h.results[k] = next
			k++
		}
	}
	if changed {
		select {
		case h.changed <- struct{}{}:
		default:
		}
	}
	return slices.Clone(h.results)
}

// runUnit runs u within its timeout. A check stuck in the kernel (statfs
// on a dead NFS server never returns) is abandoned, not waited for: its
// goroutine ends whenever the call does.
func runUnit(ctx context.Context, u checkUnit) []string {
	ctx, cancel := context.WithTimeout(ctx, u.timeout)
	defer cancel()
	done := make(chan []string, 1)
	go func() { done <- u.run(ctx) }()
	select {
	case msgs := <-done:
		return msgs
	case <-ctx.Done():
		msgs := make([]string, len(u.checks))
		for i := range msgs {
			msgs[i] = fmt.Sprintf("no verdict within %s", u.timeout)
		}
		return msgs
	}
}

// Loop runs the checks every interval until ctx ends.
func (h *NodeHealth) Loop(ctx context.Context) {
	ticker := h.clock.NewTicker(h.interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.Chan():
			h.Run(ctx)
		}
	}
}

// errUnhealthy refuses to start workers on a node failing a check.
var errUnhealthy = errors.New("node health check failing")

// Gate runs the checks right before workers start; an error names the
// failing ones.
func (h *NodeHealth) Gate(ctx context.Context) error {
	results := h.Run(ctx)
	if health.Eligible(results) {
		return nil
	}
	return fmt.Errorf("%w before start: %s", errUnhealthy, health.Summary(results))
}

// healthProto is checks as sent to the controller.
func healthProto(checks []health.Check) []*rdzvv1.HealthCheckResult {
	out := make([]*rdzvv1.HealthCheckResult, len(checks))
	for i, c := range checks {
		out[i] = &rdzvv1.HealthCheckResult{Name: c.Name, Ok: c.OK, Message: c.Message, Since: timestamppb.New(c.Since), Critical: c.Critical}
	}
	return out
}

// gpuCheck returns the gpu and gpu-performance checks' messages.
func gpuCheck(ctx context.Context, gpus GPUStateReader, policy health.GPUPolicy) []string {
	states, err := gpus.States(ctx)
	if err != nil {
		return []string{fmt.Sprintf("reading GPU state: %v", err), ""}
	}
	critical, soft := policy.Judge(states)
	return []string{strings.Join(critical, "; "), strings.Join(soft, "; ")}
}

// iffUp is IFF_UP in /sys/class/net/IF/flags.
const iffUp = 0x1

// networkCheck checks the chosen interface, and InfiniBand ports, in sysfs.
func networkCheck(sysfs, iface string, cfg NetworkCheckConfig) string {
	var problems []string
	dir := filepath.Join(sysfs, "class", "net", iface)
	read := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		return strings.TrimSpace(string(b)), err
	}
	switch state, err := read("operstate"); {
	case err != nil:
		problems = append(problems, fmt.Sprintf("interface %s: %v", iface, err))
	case state == "up":
	case state == "unknown":
		// Drivers without carrier state (loopback, tun) say unknown; the
		// administrative flag is all there is.
		flags, err := read("flags")
		v, perr := strconv.ParseUint(strings.TrimPrefix(flags, "0x"), 16, 32)
		if err != nil || perr != nil || v&iffUp == 0 {
			problems = append(problems, fmt.Sprintf("interface %s is down (operstate unknown, flags %s)", iface, flags))
		}
	default:
		problems = append(problems, fmt.Sprintf("interface %s is %s", iface, state))
	}
	if cfg.SpeedMbps > 0 {
		// The kernel answers -1 or EINVAL for a link without carrier.
		s, err := read("speed")
		speed, perr := strconv.Atoi(s)
		switch {
		case err != nil || perr != nil || speed < 0:
			problems = append(problems, fmt.Sprintf("interface %s: link speed unknown, expected %d Mb/s", iface, cfg.SpeedMbps))
		case speed < cfg.SpeedMbps:
			problems = append(problems, fmt.Sprintf("interface %s at %d Mb/s, expected %d", iface, speed, cfg.SpeedMbps))
		}
	}
	if cfg.MTU > 0 {
		if m, err := read("mtu"); err != nil || m != strconv.Itoa(cfg.MTU) {
			problems = append(problems, fmt.Sprintf("interface %s MTU %s, expected %d", iface, m, cfg.MTU))
		}
	}
	if cfg.InfiniBand {
		ports, _ := filepath.Glob(filepath.Join(sysfs, "class", "infiniband", "*", "ports", "*", "state"))
		for _, p := range ports {
			b, err := os.ReadFile(p)
			// "4: ACTIVE"
			if state := strings.TrimSpace(string(b)); err != nil || !strings.HasSuffix(state, "ACTIVE") {
				port := filepath.Dir(p)
				dev := filepath.Base(filepath.Dir(filepath.Dir(port)))
				problems = append(problems, fmt.Sprintf("InfiniBand %s port %s is %s", dev, filepath.Base(port), strings.TrimSpace(strings.TrimLeft(state, "0123456789:"))))
			}
		}
	}
	return strings.Join(problems, "; ")
}

// storageCheck checks each checkpoint root: there, mounted if required,
// writable, with enough free space.
func storageCheck(fs FSInfo, cfg StorageCheckConfig) string {
	var problems []string
	var rootDev uint64
	if cfg.RequireMount {
		var err error
		if rootDev, err = fs.Device("/"); err != nil {
			return err.Error()
		}
	}
	for _, p := range cfg.Paths {
		if cfg.RequireMount {
			dev, err := fs.Device(p)
			if err != nil {
				problems = append(problems, err.Error())
				continue
			}
			if dev == rootDev {
				problems = append(problems, p+": not mounted (on the root filesystem)")
				continue
			}
		}
		free, total, err := fs.Usage(p)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		if cfg.MinFreeBytes > 0 && free < cfg.MinFreeBytes {
			problems = append(problems, fmt.Sprintf("%s: %s free of %s, below min_free_bytes %s", p, bytesText(free), bytesText(total), bytesText(cfg.MinFreeBytes)))
		} else if pct := 100 * float64(free) / float64(max(total, 1)); cfg.MinFreePercent > 0 && pct < cfg.MinFreePercent {
			problems = append(problems, fmt.Sprintf("%s: %.1f%% free (%s of %s), below min_free_percent %g", p, pct, bytesText(free), bytesText(total), cfg.MinFreePercent))
		}
		if err := probeWrite(p, nil); err != nil {
			problems = append(problems, fmt.Sprintf("%s: not writable: %v%s", p, err, writeFix(p, err)))
		}
	}
	return strings.Join(problems, "; ")
}

func bytesText(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// checkOutputLines is how much of a failing command's stderr is reported.
const checkOutputLines = 5

// commandCheck runs an operator's check in a clean environment, in its own
// process group (killed whole on timeout), as cred when set.
func commandCheck(ctx context.Context, c CommandCheck, cred *syscall.Credential, path string) string {
	cmd := exec.CommandContext(ctx, c.Path, c.Args...)
	cmd.Dir, cmd.Env = "/", []string{"PATH=" + path}
	var stderr limitedBuffer
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A grandchild holding stderr open must not keep the check waiting.
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if err == nil {
		return ""
	}
	if ctx.Err() != nil {
		return "no verdict in time: killed"
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if len(lines) > checkOutputLines {
		lines = lines[:checkOutputLines]
	}
	if out := strings.TrimSpace(strings.Join(lines, "\n")); out != "" {
		return fmt.Sprintf("%v: %s", err, out)
	}
	return err.Error()
}

// limitedBuffer keeps the first wire.MaxTextBytes written and drops the
// rest, so a chatty check cannot grow the agent.
type limitedBuffer struct{ bytes.Buffer }

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := wire.MaxTextBytes - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
