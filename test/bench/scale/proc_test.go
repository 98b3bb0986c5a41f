//go:build bench

package scale

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/controller/store"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/test/sim"
)

// procSample is what /proc says of a process.
type procSample struct {
	at      time.Time
	cpu     time.Duration // user + system
	rss     uint64        // bytes
	rssAnon uint64        // bytes: the heap, stacks, the runtime's own
	rssFile uint64        // bytes: the binary's pages, etcd's mapped database
	threads int
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

func sampleProc(pid int) (procSample, error) {
	s := procSample{at: time.Now()}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	// Fields after the command name, which is in parentheses and may hold
	// spaces: state is field 3, utime 14, stime 15.
	rest := string(stat[strings.LastIndexByte(string(stat), ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 13 {
		return s, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return s, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	s.cpu = time.Duration(utime+stime) * time.Second / clockTicks
	status, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	defer status.Close()
	sc := bufio.NewScanner(status)
	for sc.Scan() {
		key, val, _ := strings.Cut(sc.Text(), ":")
		fields := strings.Fields(val)
		if len(fields) == 0 {
			continue
		}
		switch key {
		case "VmRSS":
			kb, _ := strconv.ParseUint(fields[0], 10, 64)
			s.rss = kb << 10
		case "RssAnon":
			kb, _ := strconv.ParseUint(fields[0], 10, 64)
			s.rssAnon = kb << 10
		case "RssFile":
			kb, _ := strconv.ParseUint(fields[0], 10, 64)
			s.rssFile = kb << 10
		case "Threads":
			s.threads, _ = strconv.Atoi(fields[0])
		}
	}
	return s, sc.Err()
}

// cpuBusy is the whole machine's busy time so far (/proc/stat), to tell
// how much of it others used while the benchmark ran.
func cpuBusy() (time.Duration, error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, errors.New("/proc/stat: no cpu line")
	}
	var busy uint64
	// user nice system idle iowait irq softirq steal: all but idle and iowait.
	for i, v := range f[1:9] {
		if i == 3 || i == 4 {
			continue
		}
		n, _ := strconv.ParseUint(v, 10, 64)
		busy += n
	}
	return time.Duration(busy) * time.Second / clockTicks, nil
}

func loadAvg() string {
	data, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// pprofClient talks to the controller's profile socket.
func pprofClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
}

// pprofGet fetches one of a daemon's profiles (path and query) from its
// --pprof-socket.
func pprofGet(ctx context.Context, sock, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://controller/debug/pprof/"+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := pprofClient(sock).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", path, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

// goroutines is the controller's goroutine count.
func goroutines(ctx context.Context, sock string) (int, error) {
	data, err := pprofGet(ctx, sock, "goroutine?debug=1")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(data), "\n")
	var n int
	if _, err := fmt.Sscanf(line, "goroutine profile: total %d", &n); err != nil {
		return 0, fmt.Errorf("parsing %q: %w", line, err)
	}
	return n, nil
}

// memStats are the controller's runtime.MemStats that the debug form of
// the heap profile ends with, by name (HeapInuse, StackInuse, ...).
func memStats(ctx context.Context, sock string) (map[string]uint64, error) {
	return readMemStats(ctx, sock, "heap?debug=1")
}

// memStatsAfterGC is memStats right after a collection the profile
// endpoint forces.
func memStatsAfterGC(ctx context.Context, sock string) (map[string]uint64, error) {
	return readMemStats(ctx, sock, "heap?debug=1&gc=1")
}

func readMemStats(ctx context.Context, sock, path string) (map[string]uint64, error) {
	data, err := pprofGet(ctx, sock, path)
	if err != nil {
		return nil, err
	}
	stats := map[string]uint64{}
	for _, line := range strings.Split(string(data), "\n") {
		name, v, ok := strings.Cut(strings.TrimPrefix(line, "# "), " = ")
		if !ok || !strings.HasPrefix(line, "# ") {
			continue
		}
		// Some lines are "in use / reserved" (Stack = 1 / 2).
		first, _, _ := strings.Cut(v, " ")
		if n, err := strconv.ParseUint(first, 10, 64); err == nil {
			stats[name] = n
		}
	}
	if _, ok := stats["HeapInuse"]; !ok {
		return nil, errors.New("no HeapInuse in the heap profile")
	}
	return stats, nil
}

// profile is a CPU profile of the controller being taken.
type profile struct {
	done chan error
}

// startProfile profiles the controller's CPU for d into path.
func startProfile(ctx context.Context, sock string, d time.Duration, path string) *profile {
	p := &profile{done: make(chan error, 1)}
	go func() {
		data, err := pprofGet(ctx, sock, fmt.Sprintf("profile?seconds=%d", int(d.Seconds())))
		if err == nil {
			err = os.WriteFile(path, data, 0o644)
		}
		p.done <- err
	}()
	return p
}

// top summarizes a profile with `go tool pprof -top`.
func top(ctx context.Context, bin, path string, nodes int, args ...string) string {
	args = append(append([]string{"tool", "pprof", "-top", "-nodecount", strconv.Itoa(nodes)}, args...), bin, path)
	out, err := exec.CommandContext(ctx, "go", args...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("(go tool pprof: %v: %s)", err, out)
	}
	return string(out)
}

// durable follows etcd, through the embedded etcd's socket, to see when
// the controller's writes are durable: node records, worker statuses and
// events of the benchmark's job.
type durable struct {
	job string
	cli *clientv3.Client

	mu      sync.Mutex
	ready   map[string]bool // nodes whose stored state is READY
	readyAt time.Time       // when the latest of them arrived
	lost    map[string]bool // nodes whose stored state is LOST
	losses  int             // times a node's stored state became LOST
	running map[uint64]map[string]bool
	runAt   map[uint64]time.Time
	roundAt map[uint64]time.Time // when each generation's round arrived
	events  []*rdzvv1.Event
	// keys and txns count every key written or deleted under store.Prefix
	// and the transactions (distinct revisions) that wrote them.
	keys, txns int
	lastRev    int64
	// trace, unless nil, gets a line per transaction as it arrives: when,
	// its revision, how many keys and the first of them.
	trace io.Writer
	err   error
}

func watchDurable(ctx context.Context, ctl *sim.Controller, job string, trace io.Writer, fromStart bool) (*durable, func(), error) {
	endpoint, err := ctl.EtcdEndpoint()
	if err != nil {
		return nil, nil, err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to the embedded etcd: %w", err)
	}
	d := &durable{job: job, cli: cli, trace: trace, ready: map[string]bool{}, lost: map[string]bool{}, running: map[uint64]map[string]bool{}, runAt: map[uint64]time.Time{}, roundAt: map[uint64]time.Time{}}
	ctx, cancel := context.WithCancel(ctx)
	// The watch starts at the current revision, or the first: everything
	// written from there on arrives, in order.
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if fromStart {
		opts = append(opts, clientv3.WithRev(1))
	}
	wch := cli.Watch(clientv3.WithRequireLeader(ctx), store.Prefix, opts...)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for resp := range wch {
			if err := resp.Err(); err != nil {
				d.mu.Lock()
				d.err = err
				d.mu.Unlock()
				return
			}
			now := time.Now()
			d.count(resp.Events, now)
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypePut {
					d.put(string(ev.Kv.Key), ev.Kv.Value, now)
				}
			}
		}
	}()
	return d, func() { cancel(); <-stopped; cli.Close() }, nil
}

// caughtUp waits until the watch has had every write etcd made so far.
// Until then the embedded etcd holds the backlog in the controller's
// heap, which a saturated machine lets grow to megabytes.
func (d *durable) caughtUp(ctx context.Context) error {
	resp, err := d.cli.Get(ctx, store.Prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return err
	}
	rev := resp.Header.Revision
	return sim.WaitFor(ctx, "the benchmark's etcd watch caught up", func() (bool, string) {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.lastRev >= rev, fmt.Sprintf("at revision %d of %d", d.lastRev, rev)
	})
}

func (d *durable) count(evs []*clientv3.Event, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, ev := range evs {
		d.keys++
		if rev := ev.Kv.ModRevision; rev != d.lastRev {
			d.txns++
			d.lastRev = rev
			if d.trace != nil {
				n := 1
				for _, next := range evs[i+1:] {
					if next.Kv.ModRevision != rev {
						break
					}
					n++
				}
				fmt.Fprintf(d.trace, "%s\t%d\t%d\t%s\n", now.Format("15:04:05.000"), rev, n, ev.Kv.Key)
			}
		}
	}
}

// writes is how many keys the controller wrote or deleted so far, and in
// how many transactions.
func (d *durable) writes() (keys, txns int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.keys, d.txns
}

func (d *durable) put(key string, value []byte, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case strings.HasPrefix(key, store.NodesPrefix()):
		var n rdzvv1.Node
		if proto.Unmarshal(value, &n) != nil {
			return
		}
		name := n.GetInfo().GetName()
		if lost := n.GetState() == rdzvv1.NodeState_NODE_STATE_LOST; lost != d.lost[name] {
			d.lost[name] = lost
			if lost {
				d.losses++
			}
		}
		if ready := n.GetState() == rdzvv1.NodeState_NODE_STATE_READY; ready != d.ready[name] {
			d.ready[name] = ready
			if ready {
				d.readyAt = now
			}
		}
	case strings.HasPrefix(key, store.WorkersPrefix(d.job)):
		var w rdzvv1.WorkerStatus
		if proto.Unmarshal(value, &w) != nil || w.GetState() != rdzvv1.WorkerState_WORKER_STATE_RUNNING {
			return
		}
		node := strings.TrimPrefix(key, store.WorkersPrefix(d.job))
		m := d.running[w.GetGeneration()]
		if m == nil {
			m = map[string]bool{}
			d.running[w.GetGeneration()] = m
		}
		if !m[node] {
			m[node] = true
			d.runAt[w.GetGeneration()] = now
		}
	case strings.HasPrefix(key, store.RoundsPrefix(d.job)):
		var r rdzvv1.Round
		if proto.Unmarshal(value, &r) == nil {
			d.roundAt[r.GetGeneration()] = now
		}
	case strings.HasPrefix(key, store.EventsPrefix(d.job)):
		var e rdzvv1.Event
		if proto.Unmarshal(value, &e) == nil {
			d.events = append(d.events, &e)
		}
	}
}

func (d *durable) readyCount() (int, time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, r := range d.ready {
		if r {
			n++
		}
	}
	return n, d.readyAt
}

// lossCount is how many times a node was declared lost so far.
func (d *durable) lossCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.losses
}

func (d *durable) runningCount(gen uint64) (int, time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.running[gen]), d.runAt[gen]
}

// round is when generation gen's round was durable.
func (d *durable) round(gen uint64) time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.roundAt[gen]
}

// event is the first stored event of kind (and generation, unless 0).
func (d *durable) event(kind string, gen uint64) *rdzvv1.Event {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, e := range d.events {
		if e.GetKind() == kind && (gen == 0 || e.GetGeneration() == gen) {
			return e
		}
	}
	return nil
}
