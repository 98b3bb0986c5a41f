package agent

import (
	"bytes"
	"fmt"
	"net"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/zap"

	"github.com/rdzv/rdzv/health"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// Gossip keeps this node in a memberlist cluster with the other agents. It
// answers two questions heartbeats to the controller cannot: is a silent
// node unreachable for its peers too (then it is really gone), and is this
// node cut off from the cluster (then it must stop its workers itself).
//
// Timings are tighter than memberlist's LAN defaults: a dead peer is
// suspected within a probe interval and declared dead about a second later,
// well inside the controller's heartbeat timeout.
type Gossip struct {
	ml *memberlist.Memberlist
	// name is this node's member name. Event callbacks compare against it
	// rather than ask memberlist, which calls them holding its own lock.
	name string
	log  *zap.Logger
	out  *memberlistLog

	mu sync.Mutex
	// unreachable maps a peer to when it was declared dead.
	unreachable map[string]time.Time
	// watched are the peers of this node's job it probes itself (Watch),
	// those of watchJob's generation watchGen.
	watched  map[string]*watchedPeer
	watchJob string
	watchGen uint64
	changed  chan struct{}
	stop     chan struct{}
	done     chan struct{}
}

// watchedPeer is the probing state of one watched peer.
type watchedPeer struct {
	addr     net.Addr
	failures int
	// downSince is when it became unreachable; zero while reachable.
	downSince time.Time
	// answered is when its latest answer to a probe came; zero if none
	// since it was watched.
	answered time.Time
}

const (
	// maxGossipView bounds the view sent to the controller.
	maxGossipView = 1024
	// unreachableTTL forgets dead peers after a while: the view matters in
	// the seconds after a failure, and a decommissioned node must not count
	// against this node's isolation check forever.
	unreachableTTL = 2 * time.Minute
)

// StartGossip binds memberlist on addr:port (port 0 picks a free one).
func StartGossip(name, addr string, port int, log *zap.Logger) (*Gossip, error) {
	g := &Gossip{name: name, log: log, unreachable: map[string]time.Time{}, watched: map[string]*watchedPeer{},
		changed: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	cfg := memberlist.DefaultLANConfig()
	cfg.Name = name
	cfg.BindAddr, cfg.BindPort = addr, port
	cfg.AdvertiseAddr, cfg.AdvertisePort = addr, port
	cfg.ProbeInterval = 500 * time.Millisecond
	// Ping, which probes the watched peers, waits this long; the fencing
	// bounds count on it (health.IsolationLag).
	cfg.ProbeTimeout = health.WatchTimeout
	cfg.SuspicionMult = 2
	cfg.GossipInterval = 100 * time.Millisecond
	cfg.TCPTimeout = 2 * time.Second
	cfg.Events = g
	g.out = &memberlistLog{log: log}
	cfg.LogOutput = g.out
	ml, err := memberlist.Create(cfg)
	if err != nil {
		return nil, fmt.Errorf("starting gossip on %s: %w", net.JoinHostPort(addr, strconv.Itoa(port)), err)
	}
	g.ml = ml
	go g.watchLoop()
	return g, nil
}

// Watch sets the peers this node probes itself, replacing any before: the
// neighbours of its latest assignment, generation of job. A peer that does
// not answer health.WatchFailures probes in a row is reported unreachable
// at once.
func (g *Gossip) Watch(job string, generation uint64, peers []*rdzvv1.WatchedPeer) {
	watched := map[string]*watchedPeer{}
	for _, p := range peers {
		if p.GetNode() == g.name {
			continue
		}
		addr, err := net.ResolveUDPAddr("udp", p.GetGossipAddr())
		if err != nil {
			g.log.Warn("not watching a peer with a bad gossip address", zap.String("peer", p.GetNode()), zap.String("gossip_addr", p.GetGossipAddr()), zap.Error(err))
			continue
		}
		watched[p.GetNode()] = &watchedPeer{addr: addr}
	}
	g.mu.Lock()
	changed := false
	for _, w := range g.watched {
		changed = changed || !w.downSince.IsZero()
	}
	g.watched, g.watchJob, g.watchGen = watched, job, generation
	g.mu.Unlock()
	if changed {
		g.signal()
	}
}

// watchLoop probes the watched peers every health.WatchEvery, all at once,
// until Close. The fencing bounds count on these rounds' timing
// (health.IsolationLag, modelled by its tests).
func (g *Gossip) watchLoop() {
	defer close(g.done)
	ticker := time.NewTicker(health.WatchEvery)
	defer ticker.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-ticker.C:
		}
		g.mu.Lock()
		targets := make(map[string]net.Addr, len(g.watched))
		for name, w := range g.watched {
			targets[name] = w.addr
		}
		g.mu.Unlock()
		if len(targets) == 0 {
			continue
		}
		var wg sync.WaitGroup
		var resMu sync.Mutex
		// When each answer came, zero for none.
		reached := make(map[string]time.Time, len(targets))
		for name, addr := range targets {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Waits at most memberlist's probe timeout.
				_, err := g.ml.Ping(name, addr)
				resMu.Lock()
				if err == nil {
					reached[name] = time.Now()
				}
				resMu.Unlock()
			}()
		}
		wg.Wait()
		g.probed(targets, reached)
	}
}

// probed records one round of probes of the peers in targets, with when
// each answered (zero: it did not).
func (g *Gossip) probed(targets map[string]net.Addr, reached map[string]time.Time) {
	now := time.Now()
	changed := false
	g.mu.Lock()
	for name, addr := range targets {
		w := g.watched[name]
		if w == nil || w.addr != addr {
			continue // no longer watched, or watched anew meanwhile
		}
		if at := reached[name]; !at.IsZero() {
			changed = changed || !w.downSince.IsZero()
			w.failures, w.downSince, w.answered = 0, time.Time{}, at
			continue
		}
		w.failures++
		if w.failures >= health.WatchFailures && w.downSince.IsZero() {
			w.downSince, changed = now, true
			g.log.Warn("watched peer unreachable", zap.String("peer", name), zap.Int("failed_probes", w.failures))
		}
	}
	g.mu.Unlock()
	if changed {
		g.signal()
	}
}

// Addr is the host:port peers join through.
func (g *Gossip) Addr() string {
	n := g.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// Join contacts seeds unless this node already has peers.
func (g *Gossip) Join(seeds []string) {
	if len(seeds) == 0 || g.ml.NumMembers() > 1 {
		return
	}
	if n, err := g.ml.Join(seeds); err != nil {
		g.log.Warn("joining gossip failed", zap.Strings("seeds", seeds), zap.Int("joined", n), zap.Error(err))
	}
}

// View is the sorted set of unreachable peers and how many members are
// alive, this node included. A watched peer that answers its probes is
// not unreachable, whatever memberlist says: the probes are fresher, and
// the controller takes a watcher's word as its own probes' (WatchView).
func (g *Gossip) View() (unreachable []string, alive int) {
	g.mu.Lock()
	for name, since := range g.unreachable {
		if time.Since(since) > unreachableTTL {
			delete(g.unreachable, name)
			continue
		}
		if w := g.watched[name]; w != nil && w.downSince.IsZero() {
			continue
		}
		unreachable = append(unreachable, name)
	}
	for name, w := range g.watched {
		if _, dead := g.unreachable[name]; !dead && !w.downSince.IsZero() && time.Since(w.downSince) <= unreachableTTL {
			unreachable = append(unreachable, name)
		}
	}
	g.mu.Unlock()
	sort.Strings(unreachable)
	if len(unreachable) > maxGossipView {
		unreachable = unreachable[:maxGossipView]
	}
	return unreachable, g.ml.NumMembers()
}

// WatchView is the job and generation whose peers this node watches, and
// the sorted watched peers that failed its latest probes.
func (g *Gossip) WatchView() (job string, generation uint64, down []string) {
	g.mu.Lock()
	for name, w := range g.watched {
		if !w.downSince.IsZero() {
			down = append(down, name)
		}
	}
	job, generation = g.watchJob, g.watchGen
	g.mu.Unlock()
	sort.Strings(down)
	return job, generation, down
}

// Changed is signalled whenever the view changes.
func (g *Gossip) Changed() <-chan struct{} { return g.changed }

// Isolated reports whether this node reaches fewer than half of the other
// members it knows of, or none of the peers it watches. A lone member (no
// peers ever seen) counts as isolated: there is no one to say otherwise.
// The watched peers answer first: memberlist declares members dead one
// random probe at a time, which a cut-off node in a large cluster takes
// long to add up.
func (g *Gossip) Isolated() bool {
	if g.Unwatched() {
		return true
	}
	unreachable, alive := g.View()
	others := alive - 1
	return others == 0 || others < len(unreachable)
}

// Unwatched reports whether this node watches peers and none of them
// answered its latest probes (health.Cutoff).
func (g *Gossip) Unwatched() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	cut := len(g.watched) > 0
	for _, w := range g.watched {
		cut = cut && !w.downSince.IsZero()
	}
	return cut
}

// Answered is when every watched peer had answered a probe of this node's
// (the earliest of their latest answers), zero if one has not since it is
// watched; watching is false when this node watches no peer. Its watchers
// cannot have begun to report it unreachable before then
// (health.LeaseUntil).
func (g *Gossip) Answered() (at time.Time, watching bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, w := range g.watched {
		if w.answered.IsZero() {
			return time.Time{}, true
		}
		if at.IsZero() || w.answered.Before(at) {
			at = w.answered
		}
	}
	return at, len(g.watched) > 0
}

// Close leaves the cluster gracefully, so peers do not wait out a timeout
// before declaring this node gone, then stops.
func (g *Gossip) Close() {
	// memberlist's goroutines may still log for a moment after Shutdown.
	defer g.out.closed.Store(true)
	close(g.stop)
	<-g.done
	if err := g.ml.Leave(time.Second); err != nil {
		g.log.Debug("leaving gossip failed", zap.Error(err))
	}
	if err := g.ml.Shutdown(); err != nil {
		g.log.Debug("stopping gossip failed", zap.Error(err))
	}
}

// NotifyJoin implements memberlist.EventDelegate.
func (g *Gossip) NotifyJoin(n *memberlist.Node) { g.set(n.Name, false) }

// NotifyLeave implements memberlist.EventDelegate: called when a member is
// declared dead or leaves.
func (g *Gossip) NotifyLeave(n *memberlist.Node) { g.set(n.Name, true) }

// NotifyUpdate implements memberlist.EventDelegate.
func (g *Gossip) NotifyUpdate(*memberlist.Node) {}

func (g *Gossip) set(name string, unreachable bool) {
	if name == g.name {
		return
	}
	g.mu.Lock()
	_, was := g.unreachable[name]
	// A member that joins changes the view even if it was never
	// unreachable: the alive count grows. The controller counts a node's
	// word on its peers only once that count says it has some, and the
	// first view usually leaves before the join is done.
	changed := was != unreachable || !unreachable
	if unreachable {
		if !was {
			g.unreachable[name] = time.Now()
		}
	} else {
		delete(g.unreachable, name)
	}
	g.mu.Unlock()
	if changed {
		g.signal()
	}
}

func (g *Gossip) signal() {
	select {
	case g.changed <- struct{}{}:
	default:
	}
}

// memberlistLog routes memberlist's log lines to zap: warnings and errors
// as warnings, the rest at debug.
type memberlistLog struct {
	log    *zap.Logger
	closed atomic.Bool
}

func (w *memberlistLog) Write(p []byte) (int, error) {
	if w.closed.Load() {
		return len(p), nil
	}
	line := string(bytes.TrimSpace(p))
	if bytes.Contains(p, []byte("[WARN]")) || bytes.Contains(p, []byte("[ERR]")) {
		w.log.Warn("gossip", zap.String("detail", line))
	} else {
		w.log.Debug("gossip", zap.String("detail", line))
	}
	return len(p), nil
}
