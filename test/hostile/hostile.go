// Package hostile runs hostile peers against a real rdzv-controller and
// rdzv-relay (the binaries, on loopback) while three simulated agents keep
// their streams through the relay, and measures what each attack costs:
// both daemons' resident memory before, at its peak during and after the
// attack, and the agents' heartbeat round trips during it. It is for
// tests and benchmarks only: test/e2e's TestHostilePeers (short, asserting
// memory bounds) and make bench-hostile (figures). Every attack is bounded
// in time and count, and speaks to 127.0.0.1 only.
package hostile

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/rdzv/rdzv/health"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/test/sim"
	"github.com/rdzv/rdzv/wire"
)

// Config sizes a run.
type Config struct {
	// BinDir holds rdzv-controller and rdzv-relay.
	BinDir string
	// Dir holds certificates and logs.
	Dir string
	// Duration is each attack's.
	Duration time.Duration
	// Conns is how many unauthenticated connections the connection attack
	// holds open at each daemon (1,000).
	Conns int
	// Calls is how many 15 MB StartJob calls without a certificate run at
	// once (50).
	Calls int
}

// realAgents is how many simulated agents keep streams through the relay.
const realAgents = 3

// bigBytes is the size of the attacks' large messages: under the 16 MiB
// message limit, so that only authentication stands in their way.
const bigBytes = 15 << 20

var heartbeat = health.Heartbeat{Interval: time.Second, Timeout: 10 * time.Second, Vouched: time.Minute}

// Cluster is a controller, a relay, and agents streaming through it.
type Cluster struct {
	cfg     Config
	certs   *sim.Certs
	ctl     *sim.Controller
	relay   *sim.Relay
	agents  []*sim.Agent
	cancel  context.CancelFunc
	foreign tls.Certificate
	// revoked is the certificate of an agent revoked at the controller.
	revoked tls.Certificate
	// spare is a valid agent certificate no running agent uses.
	spare tls.Certificate

	mu   sync.Mutex
	rtts []time.Duration
}

// Start starts the cluster and waits until the agents are registered.
func Start(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if err := sim.RaiseNoFile(uint64(4*cfg.Conns + 4096)); err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if c.certs, err = sim.LoadCerts(filepath.Join(cfg.Dir, "pki"), realAgents+2); err != nil {
		return nil, err
	}
	c.spare, c.revoked = c.certs.Agents[realAgents], c.certs.Agents[realAgents+1]
	foreignCA, err := pki.NewCA("foreign", 24*time.Hour, time.Now())
	if err != nil {
		return nil, err
	}
	is, err := foreignCA.Issue(pki.Request{Identity: pki.Identity{Role: pki.RoleAgent, Name: sim.Name(0)}, ValidFor: time.Hour, Now: time.Now()})
	if err != nil {
		return nil, err
	}
	c.foreign = tls.Certificate{Certificate: [][]byte{is.Cert.Raw}, PrivateKey: is.Key, Leaf: is.Cert}

	if c.ctl, err = sim.StartController(sim.ControllerConfig{Bin: filepath.Join(cfg.BinDir, "rdzv-controller"), Dir: cfg.Dir, Certs: c.certs, Heartbeat: heartbeat}); err != nil {
		return nil, err
	}
	op, err := c.certs.OperatorClient(c.ctl.Addr)
	if err != nil {
		return nil, err
	}
	defer op.Close()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.ctl.WaitLeading(wctx, op); err != nil {
		return nil, err
	}
	if _, err := op.RevokeCertificate(wctx, &rdzvv1.RevokeCertificateRequest{
		Target: &rdzvv1.RevokeCertificateRequest_Serial{Serial: pki.Serial(c.revoked.Leaf)}, Reason: "hostile-peer test",
	}); err != nil {
		return nil, fmt.Errorf("revoking %s: %w", sim.Name(realAgents+1), err)
	}
	if c.relay, err = sim.StartRelay(filepath.Join(cfg.BinDir, "rdzv-relay"), cfg.Dir, c.certs, 0, c.ctl.Addr); err != nil {
		return nil, err
	}
	actx, acancel := context.WithCancel(context.Background())
	c.cancel = acancel
	registered := make(chan string, realAgents)
	for i := range realAgents {
		a, err := sim.NewAgent(actx, sim.AgentConfig{Index: i, Controller: c.ctl.Addr, Relay: c.relay.Addr, Cert: c.certs.Agents[i], Roots: c.certs.Roots,
			Observe: func(e sim.Event) {
				switch e.Kind {
				case sim.Registered:
					if e.First {
						registered <- e.Agent.Name()
					}
				case sim.HeartbeatAcked:
					c.mu.Lock()
					c.rtts = append(c.rtts, e.RTT)
					c.mu.Unlock()
				}
			}})
		if err != nil {
			return nil, err
		}
		a.Start(actx)
		c.agents = append(c.agents, a)
	}
	for range realAgents {
		select {
		case <-registered:
		case <-wctx.Done():
			return nil, fmt.Errorf("agents not registered: %w", wctx.Err())
		}
	}
	return c, nil
}

// Close stops everything Start started.
func (c *Cluster) Close() {
	for _, a := range c.agents {
		a.Stop()
	}
	if c.cancel != nil {
		c.cancel()
	}
	if c.relay != nil {
		c.relay.Stop()
	}
	if c.ctl != nil {
		c.ctl.Stop()
	}
}

// Logs is the tail of both daemons' logs, for a failure's message.
func (c *Cluster) Logs() string {
	return "controller:\n" + sim.TailFile(c.ctl.LogPath, 20) + "\nrelay:\n" + sim.TailFile(c.relay.LogPath, 20)
}

// Attack is one hostile peer's behaviour, run until ctx ends; it returns
// what it saw (status codes, errors), for the figures.
type Attack struct {
	Name string
	// Authenticated: the attacker holds a valid certificate, and what it
	// sends is bounded by the API's limits, not the pre-authentication
	// ones.
	Authenticated bool
	Run           func(ctx context.Context) string
}

// Figures are what one attack cost.
type Figures struct {
	Attack        string
	Authenticated bool
	// Memory in bytes (RSS): before the attack, its peak during it, and a
	// second after it.
	CtlBefore, CtlPeak, CtlAfter       uint64
	RelayBefore, RelayPeak, RelayAfter uint64
	// The real agents' heartbeat round trips during the attack.
	Heartbeats   int
	HeartbeatP50 time.Duration
	HeartbeatP99 time.Duration
	// Seen is what the attacker saw.
	Seen string
}

// Attacks are the attacks, in the order they run.
func (c *Cluster) Attacks() []Attack {
	return []Attack{
		{"no certificate", false, func(ctx context.Context) string { return c.refusedCalls(ctx, nil) }},
		{"foreign CA", false, func(ctx context.Context) string { return c.refusedCalls(ctx, &c.foreign) }},
		{"revoked agent", false, func(ctx context.Context) string { return c.refusedCalls(ctx, &c.revoked) }},
		{"16 MB header (framed and HTTP/2)", false, c.bigFrameHeader},
		{"one byte a second", false, c.slowloris},
		{"ping flood", false, c.pingFlood},
		{fmt.Sprintf("%d unauthenticated connections", c.cfg.Conns), false, c.manyConns},
		{"oversized register from a valid agent", true, c.oversizedRegister},
		{fmt.Sprintf("%d concurrent 15 MB StartJob without certificate", c.cfg.Calls), false, c.bigStartJobs},
	}
}

// Run runs a for the configured duration and measures it.
func (c *Cluster) Run(ctx context.Context, a Attack) (Figures, error) {
	f := Figures{Attack: a.Name, Authenticated: a.Authenticated}
	var err error
	if f.CtlBefore, err = rss(c.ctl.Pid()); err != nil {
		return f, err
	}
	if f.RelayBefore, err = rss(c.relay.Pid()); err != nil {
		return f, err
	}
	f.CtlPeak, f.RelayPeak = f.CtlBefore, f.RelayBefore
	c.mu.Lock()
	c.rtts = c.rtts[:0]
	c.mu.Unlock()

	actx, cancel := context.WithTimeout(ctx, c.cfg.Duration)
	defer cancel()
	seen := make(chan string, 1)
	go func() { seen <- a.Run(actx) }()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	sample := func() {
		if v, err := rss(c.ctl.Pid()); err == nil {
			f.CtlPeak = max(f.CtlPeak, v)
		}
		if v, err := rss(c.relay.Pid()); err == nil {
			f.RelayPeak = max(f.RelayPeak, v)
		}
	}
wait:
	for {
		select {
		case f.Seen = <-seen:
			break wait
		case <-tick.C:
			sample()
		}
	}
	sample()
	c.mu.Lock()
	rtts := slices.Clone(c.rtts)
	c.mu.Unlock()
	slices.Sort(rtts)
	f.Heartbeats = len(rtts)
	if len(rtts) > 0 {
		f.HeartbeatP50 = rtts[len(rtts)/2]
		f.HeartbeatP99 = rtts[min(len(rtts)-1, len(rtts)*99/100)]
	}
	time.Sleep(time.Second)
	if f.CtlAfter, err = rss(c.ctl.Pid()); err != nil {
		return f, fmt.Errorf("the controller after %s: %w", a.Name, err)
	}
	if f.RelayAfter, err = rss(c.relay.Pid()); err != nil {
		return f, fmt.Errorf("the relay after %s: %w", a.Name, err)
	}
	return f, nil
}

// Table formats figures as a table.
func Table(figs []Figures) string {
	var b strings.Builder
	mib := func(v uint64) string { return strconv.FormatFloat(float64(v)/(1<<20), 'f', 0, 64) }
	fmt.Fprintf(&b, "%-48s %-18s %-18s %s\n", "attack", "controller MiB", "relay MiB", "agents' heartbeat RTT")
	fmt.Fprintf(&b, "%-48s %-18s %-18s %s\n", "", "before/peak/after", "before/peak/after", "p50 / p99 (n)")
	for _, f := range figs {
		fmt.Fprintf(&b, "%-48s %-18s %-18s %s\n    attacker saw: %s\n", f.Attack,
			mib(f.CtlBefore)+"/"+mib(f.CtlPeak)+"/"+mib(f.CtlAfter),
			mib(f.RelayBefore)+"/"+mib(f.RelayPeak)+"/"+mib(f.RelayAfter),
			fmt.Sprintf("%v / %v (%d)", f.HeartbeatP50.Round(100*time.Microsecond), f.HeartbeatP99.Round(100*time.Microsecond), f.Heartbeats),
			f.Seen)
	}
	return b.String()
}

// rss is pid's resident memory in bytes.
func rss(pid int) (uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
}

// tally counts what the attackers saw, by kind.
type tally struct {
	mu     sync.Mutex
	counts map[string]int
}

func (t *tally) add(what string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.counts == nil {
		t.counts = map[string]int{}
	}
	t.counts[what]++
}

// addErr counts how a call at where ended.
func (t *tally) addErr(where string, err error) {
	switch {
	case err == nil:
		t.add(where + ": ok")
	case status.Code(err) != codes.Unknown:
		t.add(where + ": " + status.Code(err).String())
	default:
		t.add(where + ": error")
	}
}

// where names the daemon at addr.
func (c *Cluster) where(addr string) string {
	if addr == c.ctl.Addr {
		return "controller"
	}
	return "relay"
}

func (t *tally) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := make([]string, 0, len(t.counts))
	for k := range t.counts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, t.counts[k])
	}
	return strings.Join(parts, ", ")
}

// workers runs n copies of f until ctx ends.
func workers(ctx context.Context, n int, f func(ctx context.Context)) {
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				f(ctx)
			}
		}()
	}
	wg.Wait()
}

// tlsConfig is an attacker's: it presents cert, if any, and checks nothing.
func tlsConfig(cert *tls.Certificate, alpn ...string) *tls.Config {
	conf := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, NextProtos: alpn}
	if cert != nil {
		conf.Certificates = []tls.Certificate{*cert}
	}
	return conf
}

// grpcConn dials addr with cert, if any; a message of bigBytes may be sent.
func grpcConn(addr string, cert *tls.Certificate) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsConfig(cert))),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(wire.MaxMessageBytes)))
}

// register opens an agent stream on conn and registers as node, with
// labels padded by pad bytes; the answer's status is what it returns.
func register(ctx context.Context, conn *grpc.ClientConn, node string, pad int) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := rdzvv1.NewAgentServiceClient(conn).Connect(ctx)
	if err != nil {
		return err
	}
	info := &rdzvv1.NodeInfo{Name: node, Address: "127.0.0.1", NcclInterface: "lo", AgentVersion: "hostile"}
	if pad > 0 {
		info.Labels = map[string]string{"pad": strings.Repeat("x", pad)}
	}
	if err := stream.Send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Register{Register: &rdzvv1.Register{Node: info}}}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_, err = stream.Recv()
	return err
}

// refusedCalls calls the controller's API and registers at the relay
// (in frames, as agents do) with cert, over and over, each time on a new
// connection.
func (c *Cluster) refusedCalls(ctx context.Context, cert *tls.Certificate) string {
	var t tally
	workers(ctx, 4, func(ctx context.Context) {
		if conn, err := grpcConn(c.ctl.Addr, cert); err == nil {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := rdzvv1.NewNodeServiceClient(conn).ListNodes(cctx, &rdzvv1.ListNodesRequest{})
			cancel()
			t.addErr("controller", err)
			_ = conn.Close()
		}
		t.addErr("relay framed", c.framedRegister(ctx, cert, 0))
	})
	return t.String()
}

// framedRegister registers at the relay in frames (wire.AgentProtocol)
// with cert, labels padded by pad bytes; it returns how the stream ended.
func (c *Cluster) framedRegister(ctx context.Context, cert *tls.Certificate, pad int) error {
	d := tls.Dialer{Config: tlsConfig(cert, wire.AgentProtocol)}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := d.DialContext(dctx, "tcp", c.relay.Addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(dctx, func() { _ = conn.Close() })
	defer stop()
	info := &rdzvv1.NodeInfo{Name: sim.Name(0), Address: "127.0.0.1", NcclInterface: "lo", AgentVersion: "hostile"}
	if pad > 0 {
		info.Labels = map[string]string{"pad": strings.Repeat("x", pad)}
	}
	b, err := wire.AppendMessage(nil, &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Register{Register: &rdzvv1.Register{Node: info}}})
	if err != nil {
		return err
	}
	if _, err := conn.Write(b); err != nil {
		return err
	}
	for {
		kind, payload, err := wire.ReadFrame(conn)
		if err != nil {
			return err
		}
		if kind == wire.FrameEnd {
			st, err := wire.EndStatus(payload)
			if err != nil {
				return err
			}
			return st.Err()
		}
		if kind == wire.FrameMessage {
			return nil
		}
	}
}

// bigFrameHeader opens framed connections to the relay without a
// certificate, each announcing a frame of 16 MiB and sending it as fast
// as the relay reads; and HTTP/2 connections to both daemons, each
// sending a header of 16 MiB.
func (c *Cluster) bigFrameHeader(ctx context.Context) string {
	var t tally
	var wg sync.WaitGroup
	for _, addr := range []string{c.ctl.Addr, c.relay.Addr} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			workers(ctx, 4, func(ctx context.Context) { t.add(c.where(addr) + " h2: " + bigHeader(ctx, addr)) })
		}()
	}
	defer wg.Wait()
	workers(ctx, 8, func(ctx context.Context) {
		d := tls.Dialer{Config: tlsConfig(nil, wire.AgentProtocol)}
		conn, err := d.DialContext(ctx, "tcp", c.relay.Addr)
		if err != nil {
			t.add("relay framed: dial refused")
			return
		}
		defer conn.Close()
		stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
		defer stop()
		head := []byte{1, 0, 0, 1, wire.FrameMessage} // 16 MiB + 1
		if _, err := conn.Write(head); err != nil {
			t.add("relay framed: write refused")
			return
		}
		n, _ := io.Copy(conn, io.LimitReader(zeroReader{}, 16<<20))
		if n < 16<<20 {
			t.add("relay framed: cut off")
		} else {
			t.add("relay framed: all 16 MiB sent")
		}
	})
	return t.String()
}

// bigHeader sends, without a certificate, an HTTP/2 HEADERS frame and
// CONTINUATION frames holding one header of 16 MiB, as fast as addr
// reads them, and says how far it got.
func bigHeader(ctx context.Context, addr string) string {
	d := tls.Dialer{Config: tlsConfig(nil, "h2")}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "dial refused"
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	go func() { _, _ = io.Copy(io.Discard, conn) }()
	const size = 16 << 20
	// HPACK: a literal header field without indexing, a new name "x-pad",
	// a value of size bytes (its length an integer of 7-bit prefix).
	block := []byte{0, 5, 'x', '-', 'p', 'a', 'd', 127}
	for n := size - 127; ; n >>= 7 {
		if n < 128 {
			block = append(block, byte(n))
			break
		}
		block = append(block, byte(n&127)|128)
	}
	if _, err := conn.Write(h2Preface); err != nil {
		return "closed at once"
	}
	const chunk = 16 << 10 // HTTP/2's default largest frame
	value := make([]byte, chunk)
	sent := 0
	for kind := byte(1); sent < size; kind = 9 { // HEADERS, then CONTINUATION
		payload := value
		if kind == 1 {
			payload = append(block, value[:chunk-len(block)]...)
		}
		var flags byte
		if sent+len(payload) >= size {
			flags = 4 // END_HEADERS
		}
		frame := append([]byte{byte(len(payload) >> 16), byte(len(payload) >> 8), byte(len(payload)), kind, flags, 0, 0, 0, 1}, payload...)
		if _, err := conn.Write(frame); err != nil {
			return "header cut off"
		}
		sent += len(payload)
	}
	return "all 16 MiB of header sent"
}

// slowloris holds connections to both daemons, sending a byte a second.
func (c *Cluster) slowloris(ctx context.Context) string {
	var t tally
	var wg sync.WaitGroup
	for _, addr := range []string{c.ctl.Addr, c.relay.Addr} {
		for range 100 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
				if err != nil {
					t.add(c.where(addr) + ": dial refused")
					return
				}
				defer conn.Close()
				tick := time.NewTicker(time.Second)
				defer tick.Stop()
				// A TLS record header, byte by byte.
				for i := 0; ; i++ {
					if _, err := conn.Write([]byte{0x16}); err != nil {
						t.add(fmt.Sprintf("%s: closed after %d bytes", c.where(addr), i/10*10))
						return
					}
					select {
					case <-ctx.Done():
						t.add(c.where(addr) + ": held")
						return
					case <-tick.C:
					}
				}
			}()
		}
	}
	wg.Wait()
	return t.String()
}

// h2Preface is HTTP/2's client preface and an empty SETTINGS frame.
var h2Preface = append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0)

// h2Ping is an HTTP/2 PING frame.
var h2Ping = []byte{0, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}

// pingFlood sends HTTP/2 pings without a certificate to both daemons, and
// framed pings to the relay, as fast as they are read.
func (c *Cluster) pingFlood(ctx context.Context) string {
	var t tally
	flood := func(label, addr string, alpn string, preface, ping []byte) func(ctx context.Context) {
		return func(ctx context.Context) {
			d := tls.Dialer{Config: tlsConfig(nil, alpn)}
			conn, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				t.add(label + ": dial refused")
				return
			}
			defer conn.Close()
			stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
			defer stop()
			go func() { _, _ = io.Copy(io.Discard, conn) }()
			burst := slices.Concat(slices.Repeat([][]byte{ping}, 64)...)
			if _, err := conn.Write(preface); err != nil {
				t.add(label + ": closed")
				return
			}
			for ctx.Err() == nil {
				if _, err := conn.Write(burst); err != nil {
					if ctx.Err() == nil {
						t.add(label + ": closed")
					} else {
						t.add(label + ": held")
					}
					return
				}
			}
			t.add(label + ": held")
		}
	}
	var wg sync.WaitGroup
	for _, f := range []func(context.Context){
		flood("controller h2", c.ctl.Addr, "h2", h2Preface, h2Ping),
		flood("relay h2", c.relay.Addr, "h2", h2Preface, h2Ping),
		flood("relay framed", c.relay.Addr, wire.AgentProtocol, nil, wire.AppendFrame(nil, wire.FramePing, nil)),
	} {
		wg.Add(1)
		go func() { defer wg.Done(); workers(ctx, 4, f) }()
	}
	wg.Wait()
	return t.String()
}

// manyConns opens cfg.Conns TLS connections without a certificate to each
// daemon, sends HTTP/2's preface on each, and holds them.
func (c *Cluster) manyConns(ctx context.Context) string {
	var t tally
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for range c.cfg.Conns {
		for _, addr := range []string{c.ctl.Addr, c.relay.Addr} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				select {
				case sem <- struct{}{}:
				case <-ctx.Done():
					return
				}
				d := tls.Dialer{Config: tlsConfig(nil, "h2")}
				conn, err := d.DialContext(ctx, "tcp", addr)
				<-sem
				if err != nil {
					t.add(c.where(addr) + ": dial refused")
					return
				}
				defer conn.Close()
				if _, err := conn.Write(h2Preface); err != nil {
					t.add(c.where(addr) + ": closed")
					return
				}
				done := make(chan struct{})
				go func() { _, _ = io.Copy(io.Discard, conn); close(done) }()
				select {
				case <-done:
					t.add(c.where(addr) + ": closed by the server")
				case <-ctx.Done():
					t.add(c.where(addr) + ": held")
				}
			}()
		}
	}
	wg.Wait()
	return t.String()
}

// oversizedRegister registers with a valid agent certificate no agent
// runs with, at the relay (in frames) and the controller (gRPC), labels
// of 15 MB.
func (c *Cluster) oversizedRegister(ctx context.Context) string {
	var t tally
	workers(ctx, 2, func(ctx context.Context) {
		if conn, err := grpcConn(c.ctl.Addr, &c.spare); err == nil {
			t.addErr("controller gRPC", register(ctx, conn, sim.Name(realAgents), bigBytes))
			_ = conn.Close()
		}
		t.addErr("relay framed", c.framedRegister(ctx, &c.spare, bigBytes))
	})
	return t.String()
}

// bigStartJobs runs cfg.Calls StartJob calls of 15 MB at once, without a
// certificate, each on a connection of its own, over and over.
func (c *Cluster) bigStartJobs(ctx context.Context) string {
	var t tally
	big := strings.Repeat("x", bigBytes)
	spec := &rdzvv1.JobSpec{Name: "hostile", NodesMin: 1, NodesMax: 1, Command: []string{big}}
	workers(ctx, c.cfg.Calls, func(ctx context.Context) {
		conn, err := grpcConn(c.ctl.Addr, nil)
		if err != nil {
			t.add("controller: error")
			return
		}
		defer conn.Close()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err = rdzvv1.NewJobServiceClient(conn).StartJob(cctx, &rdzvv1.StartJobRequest{Spec: spec})
		if ctx.Err() == nil {
			t.addErr("controller", err)
		}
	})
	return t.String()
}

// zeroReader reads as an endless run of zero bytes.
type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
