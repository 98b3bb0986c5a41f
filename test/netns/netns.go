// Package netns runs multi-host tests on one machine. Each "host" is a
// network namespace with its own address, hostname and hosts file; a bridge
// in the root namespace joins them like a switch, so cutting a host's link
// looks to the others like a network partition.
//
// Everything a Cluster creates is named <prefix>-<what>, where the prefix is
// "rz" plus four random hex digits, and is owned through a flock on
// /run/rdzv-netns/<prefix>.lock for the Cluster's lifetime. The kernel drops
// the lock when the test process dies, which is how CleanupStale tells a
// crashed run's leftovers from a concurrent run's live cluster.
package netns

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	// Family is the name prefix of everything this package creates.
	Family = "rz"

	subnet  = "10.77.0."
	lockDir = "/run/rdzv-netns"
	etcDir  = "/etc/netns"

	// stopGrace is how long a process group gets between SIGTERM and SIGKILL.
	stopGrace = 3 * time.Second
	// settleTimeout bounds waiting for the kernel to finish tearing down.
	settleTimeout = 10 * time.Second
	logTailLines  = 40
)

var errBusy = errors.New("prefix is owned by a live cluster")

// Cluster is a set of hosts on one bridge.
type Cluster struct {
	Prefix string
	Bridge string
	// LogDir holds one log file per started process.
	LogDir string

	t     testing.TB
	hosts []*Host
	lock  *os.File

	mu    sync.Mutex
	procs []*Proc
}

// Host is one network namespace of a Cluster.
type Host struct {
	Name string // hostname inside the namespace, "h<i>"
	NS   string // network namespace name
	IP   string // address of eth0 inside the namespace
	Veth string // root-side end of the host's link, on the bridge

	c *Cluster
}

// SkipOrFail stops a test whose environment cannot run it: it skips when
// RDZV_E2E_SKIP=1 and fails otherwise, so a missing prerequisite is never
// mistaken for a pass.
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	reason := fmt.Sprintf(format, args...)
	if os.Getenv("RDZV_E2E_SKIP") == "1" {
		t.Skipf("%s (skipped because RDZV_E2E_SKIP=1)", reason)
	} else {
		t.Fatalf("%s; set RDZV_E2E_SKIP=1 to skip these tests instead", reason)
	}
}

// NewCluster creates hosts h0..h<n-1> with addresses 10.77.0.10+i/24 and
// removes them when the test ends. Process logs go to logDir, or to a
// temporary directory when logDir is empty; on failure their tails are
// written to the test log.
func NewCluster(t testing.TB, hosts int, logDir string) *Cluster {
	t.Helper()
	if os.Geteuid() != 0 {
		SkipOrFail(t, "netns: multi-host tests must run as root (they create network namespaces, veths and a bridge)")
	}
	for _, tool := range []string{"ip", "unshare", "hostname"} {
		if _, err := exec.LookPath(tool); err != nil {
			SkipOrFail(t, "netns: %q not found in PATH (install iproute2, util-linux and hostname)", tool)
		}
	}
	if hosts < 1 || 10+hosts > 254 {
		t.Fatalf("netns: %d hosts do not fit in %s0/24", hosts, subnet)
	}
	if logDir == "" {
		logDir = t.TempDir()
	} else if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatalf("netns: %v", err)
	}
	if err := CleanupStale(Family); err != nil {
		t.Fatalf("netns: removing leftovers of earlier runs: %v", err)
	}
	prefix, lock, err := reservePrefix()
	if err != nil {
		t.Fatalf("netns: %v", err)
	}
	c := &Cluster{Prefix: prefix, Bridge: prefix + "-br", LogDir: logDir, t: t, lock: lock}
	// Registered before anything exists so that a half-built cluster is
	// removed too.
	t.Cleanup(c.cleanup)
	if err := c.create(hosts); err != nil {
		t.Fatalf("netns: creating cluster %s: %v", prefix, err)
	}
	return c
}

// Host returns host i.
func (c *Cluster) Host(i int) *Host { return c.hosts[i] }

// Hosts is how many hosts the cluster has, h0 included.
func (c *Cluster) Hosts() int { return len(c.hosts) }

// CutLink takes host i's link down: its namespace keeps its address but
// nothing reaches it or leaves it.
func (c *Cluster) CutLink(i int) error { return ip("link", "set", c.hosts[i].Veth, "down") }

// RestoreLink undoes CutLink.
func (c *Cluster) RestoreLink(i int) error { return ip("link", "set", c.hosts[i].Veth, "up") }

func (c *Cluster) create(hosts int) error {
	if err := ip("link", "add", c.Bridge, "type", "bridge"); err != nil {
		return err
	}
	if err := ip("link", "set", c.Bridge, "up"); err != nil {
		return err
	}
	for i := range hosts {
		c.hosts = append(c.hosts, &Host{
			Name: fmt.Sprintf("h%d", i),
			NS:   fmt.Sprintf("%s-h%d", c.Prefix, i),
			IP:   subnet + strconv.Itoa(10+i),
			Veth: fmt.Sprintf("%s-v%d", c.Prefix, i),
			c:    c,
		})
	}
	// Every host knows every other by name, as cluster DNS would provide.
	var peers strings.Builder
	for _, h := range c.hosts {
		fmt.Fprintf(&peers, "%s\t%s\n", h.IP, h.Name)
	}
	for _, h := range c.hosts {
		// ip netns exec bind-mounts these over /etc/hosts and /etc/hostname.
		dir := filepath.Join(etcDir, h.NS)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		hostsFile := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" + peers.String()
		if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte(hostsFile), 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "hostname"), []byte(h.Name+"\n"), 0o644); err != nil {
			return err
		}
		for _, args := range [][]string{
			{"netns", "add", h.NS},
			// Creating the peer directly inside the namespace avoids a
			// temporary name that could clash in the root namespace.
			{"link", "add", h.Veth, "type", "veth", "peer", "name", "eth0", "netns", h.NS},
			{"-n", h.NS, "addr", "add", h.IP + "/24", "dev", "eth0"},
			{"-n", h.NS, "link", "set", "eth0", "up"},
			{"-n", h.NS, "link", "set", "lo", "up"},
			{"link", "set", h.Veth, "master", c.Bridge},
			{"link", "set", h.Veth, "up"},
		} {
			if err := ip(args...); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c *Cluster) cleanup() {
	c.mu.Lock()
	procs := c.procs
	c.mu.Unlock()
	for _, p := range procs {
		if err := p.terminate(); err != nil {
			c.t.Errorf("netns: %v", err)
		}
	}
	if c.t.Failed() {
		c.dumpLogs(procs)
	}
	if err := removeResources(c.Prefix, c.t.Logf); err != nil {
		c.t.Errorf("netns: removing cluster %s: %v", c.Prefix, err)
	}
	if err := unlock(c.lock); err != nil {
		c.t.Errorf("netns: %v", err)
	}
}

func (c *Cluster) dumpLogs(procs []*Proc) {
	seen := map[string]bool{}
	for _, p := range procs {
		if seen[p.logPath] {
			continue
		}
		seen[p.logPath] = true
		data, err := os.ReadFile(p.logPath)
		if err != nil {
			c.t.Logf("netns: %v", err)
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > logTailLines {
			lines = lines[len(lines)-logTailLines:]
		}
		c.t.Logf("netns: last %d lines of %s:\n%s", len(lines), p.logPath, strings.Join(lines, "\n"))
	}
}

// CleanupStale removes namespaces, links, /etc/netns entries and lock files
// named like a cluster of the given family (e.g. "rzab12-h0") whose owner has
// died, killing any process still inside such a namespace. Clusters of live
// test processes are left alone.
func CleanupStale(family string) error {
	re := regexp.MustCompile(`^(` + regexp.QuoteMeta(family) + `[0-9a-f]{4})(-(br|h[0-9]+|v[0-9]+)|\.lock)$`)
	names, err := resourceNames()
	if err != nil {
		return err
	}
	locks, err := dirNames(lockDir)
	if err != nil {
		return err
	}
	prefixes := map[string]bool{}
	for _, name := range append(names, locks...) {
		if m := re.FindStringSubmatch(name); m != nil {
			prefixes[m[1]] = true
		}
	}
	var errs []error
	for prefix := range prefixes {
		lock, err := lockPrefix(prefix)
		if errors.Is(err, errBusy) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, removeResources(prefix, func(string, ...any) {}), unlock(lock))
	}
	return errors.Join(errs...)
}

// removeResources deletes everything named <prefix>-*, reporting processes
// it had to kill through logf.
func removeResources(prefix string, logf func(string, ...any)) error {
	owned := func(name string) bool { return strings.HasPrefix(name, prefix+"-") }
	namespaces, err := netnsNames()
	if err != nil {
		return err
	}
	var errs []error
	for _, ns := range namespaces {
		if !owned(ns) {
			continue
		}
		// Deleting a namespace only unmounts its name; it lives on, with its
		// links, while any process is inside.
		if err := killNetnsProcs(ns, logf); err != nil {
			errs = append(errs, err)
		}
		if err := ip("netns", "del", ns); err != nil {
			errs = append(errs, err)
		}
	}
	links, err := dirNames("/sys/class/net")
	if err != nil {
		return err
	}
	for _, link := range links {
		if !owned(link) {
			continue
		}
		// A veth may already have gone with its namespace.
		if err := ip("link", "del", link); err != nil && linkExists(link) {
			errs = append(errs, err)
		}
	}
	etc, err := dirNames(etcDir)
	if err != nil {
		return err
	}
	for _, name := range etc {
		if owned(name) {
			errs = append(errs, os.RemoveAll(filepath.Join(etcDir, name)))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// Namespace teardown finishes asynchronously in the kernel.
	var left []string
	for deadline := time.Now().Add(settleTimeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		names, err := resourceNames()
		if err != nil {
			return err
		}
		left = left[:0]
		for _, name := range names {
			if owned(name) {
				left = append(left, name)
			}
		}
		if len(left) == 0 {
			return nil
		}
	}
	return fmt.Errorf("still present after %s: %v", settleTimeout, left)
}

func killNetnsProcs(ns string, logf func(string, ...any)) error {
	for deadline := time.Now().Add(settleTimeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		out, err := exec.Command("ip", "netns", "pids", ns).Output()
		if err != nil {
			return fmt.Errorf("ip netns pids %s: %w", ns, err)
		}
		pids := strings.Fields(string(out))
		if len(pids) == 0 {
			return nil
		}
		logf("netns: killing processes left in %s: %v", ns, pids)
		for _, s := range pids {
			if pid, err := strconv.Atoi(s); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL) // it may have exited since
			}
		}
	}
	return fmt.Errorf("processes still in %s after %s", ns, settleTimeout)
}

// resourceNames lists namespaces, root-namespace links and /etc/netns
// entries, the three kinds of thing a cluster leaves behind.
func resourceNames() ([]string, error) {
	namespaces, err := netnsNames()
	if err != nil {
		return nil, err
	}
	links, err := dirNames("/sys/class/net")
	if err != nil {
		return nil, err
	}
	etc, err := dirNames(etcDir)
	if err != nil {
		return nil, err
	}
	return append(append(namespaces, links...), etc...), nil
}

func netnsNames() ([]string, error) {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return nil, fmt.Errorf("ip netns list: %w", err)
	}
	var names []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		// Lines look like "name" or "name (id: 3)".
		if f := strings.Fields(sc.Text()); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names, nil
}

func dirNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return names, nil
}

func linkExists(name string) bool {
	_, err := os.Stat(filepath.Join("/sys/class/net", name))
	return err == nil
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// reservePrefix picks a random unused prefix and locks it.
func reservePrefix() (string, *os.File, error) {
	b := make([]byte, 2)
	for range 100 {
		_, _ = rand.Read(b) // never fails on Linux
		prefix := Family + hex.EncodeToString(b)
		lock, err := lockPrefix(prefix)
		if errors.Is(err, errBusy) {
			continue
		}
		return prefix, lock, err
	}
	return "", nil, errors.New("no free cluster prefix after 100 tries")
}

// lockPrefix takes the lock that marks prefix as owned, or returns errBusy.
func lockPrefix(prefix string) (*os.File, error) {
	if err := os.MkdirAll(lockDir, 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(lockDir, prefix+".lock")
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, errBusy
			}
			return nil, fmt.Errorf("flock %s: %w", path, err)
		}
		// unlock removes the file before releasing it; a lock won on a
		// removed file guards nothing, so try again on the current one.
		held, errHeld := f.Stat()
		current, errCur := os.Stat(path)
		if errHeld == nil && errCur == nil && os.SameFile(held, current) {
			return f, nil
		}
		f.Close()
	}
}

func unlock(f *os.File) error {
	err := os.Remove(f.Name())
	return errors.Join(err, f.Close())
}

// command runs argv inside h's network namespace, with h's /etc/hosts and
// /etc/hostname and, in a UTS namespace of its own, h's hostname. It leads a
// new process group so that it and its children can be signalled together,
// and is killed if the test process dies.
func (h *Host) command(ctx context.Context, env []string, argv []string) *exec.Cmd {
	args := append([]string{
		"netns", "exec", h.NS,
		"unshare", "--uts",
		"sh", "-c", "hostname " + h.Name + ` && exec "$@"`, "sh",
	}, argv...)
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd
}
