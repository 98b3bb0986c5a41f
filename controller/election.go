package controller

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/rdzv/rdzv/controller/store"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// electionRetry is the pause before campaigning again after losing the
// lead or failing to reach etcd.
const electionRetry = time.Second

// errSteppedDown is why leader work ends when the controller gives up the
// lead itself (a write it could not persist).
var errSteppedDown = errors.New("stepped down")

// election campaigns for this controller's lead until its context ends,
// running a lead through lead each time it wins, and keeps the gate's view
// of who leads current (watchLeader). Its own state, terms and
// revokedGrace, is its run goroutine's; the gate is atomics.
type election struct {
	cli *clientv3.Client
	// timeout bounds each etcd request; ttl is the leader lease's.
	timeout, ttl time.Duration
	// embedded is set when the controller runs its own etcd; me is its
	// advertised address.
	embedded bool
	me       string
	gate     *leaderGate
	clock    clockwork.Clock
	log      *zap.Logger
	// lead runs one lead until ctx ends or t steps down.
	lead func(ctx context.Context, t *tenure, l store.Leadership, previous string) error

	// terms counts the leads taken.
	terms uint64
	// revokedGrace is owed to the next lead after dropPreviousLead revoked
	// this controller's own lease from a killed run.
	revokedGrace time.Duration
}

// run campaigns for the lead until ctx ends, leading whenever it wins
// and campaigning again whenever it loses the lead. Embedded mode takes the
// same path; it simply always wins.
func (e *election) run(ctx context.Context) {
	if e.embedded {
		e.dropPreviousLead(ctx)
	}
	for ctx.Err() == nil {
		err := e.campaign(ctx)
		if ctx.Err() != nil {
			return
		}
		e.log.Warn("not leading, campaigning again", zap.Error(err), zap.Duration("retry_in", electionRetry))
		sleep(ctx, e.clock, electionRetry)
	}
}

// dropPreviousLead revokes the leader lease a killed run of this
// controller left in its embedded etcd. etcd renews every lease for a full
// TTL when it restarts, so the new run would otherwise wait that long to
// lead in place of its own dead self, with every agent waiting on it. No other
// controller can hold a lease there: the embedded etcd is a single member
// whose only listener is a socket in this controller's private data_dir,
// which a second controller refuses to share (startEmbedded). A failure
// costs only the wait, so it is logged, not returned.
//
// The first lead then grants its loaded nodes the lease's TTL on top of
// the reconnect grace: their agents would have spent that wait
// handshaking with the controller before it led, and a whole cluster's
// direct handshakes at once can take longer than the grace alone on a
// small machine. A node that died meanwhile is
// declared lost no later than it was with the wait.
func (e *election) dropPreviousLead(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	resp, err := e.cli.Get(rctx, store.ElectionName()+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		e.log.Warn("reading the previous run's leader key failed; waiting out its lease", zap.Error(err))
		return
	}
	for _, kv := range resp.Kvs {
		if kv.Lease == 0 {
			continue
		}
		if _, err := e.cli.Revoke(rctx, clientv3.LeaseID(kv.Lease)); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			e.log.Warn("revoking the previous run's leader lease failed; waiting out its lease", zap.String("key", string(kv.Key)), zap.Error(err))
			continue
		}
		e.log.Info("revoked the previous run's leader lease", zap.String("key", string(kv.Key)))
		e.revokedGrace = e.ttl
	}
}

// campaign waits to lead, then leads until the lead is lost.
func (e *election) campaign(ctx context.Context) error {
	ttl := int(math.Ceil(e.ttl.Seconds()))
	gctx, cancel := context.WithTimeout(ctx, e.timeout)
	lease, err := e.cli.Grant(gctx, int64(ttl))
	cancel()
	if err != nil {
		e.gate.setEtcdErr(err)
		return fmt.Errorf("granting the leader lease: %w", err)
	}
	e.gate.setEtcdErr(nil)
	// The session outlives ctx so that Close can still revoke the lease on
	// shutdown: a follower then takes over at once instead of after the TTL.
	// The TTL also bounds how long Close tries.
	sess, err := concurrency.NewSession(e.cli, concurrency.WithLease(lease.ID), concurrency.WithTTL(ttl),
		concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		return fmt.Errorf("keeping the leader lease alive: %w", err)
	}
	defer func() {
		if err := sess.Close(); err != nil {
			e.log.Warn("revoking the leader lease failed; a follower takes over when it expires", zap.Error(err))
		}
	}()
	// Leader work ends the moment the session does: a lease that could not
	// be renewed may already be another controller's lead.
	lctx, endLead := context.WithCancel(ctx)
	defer endLead()
	go func() {
		select {
		case <-sess.Done():
			endLead()
		case <-lctx.Done():
		}
	}()
	el := concurrency.NewElection(sess, store.ElectionName())
	if err := el.Campaign(lctx, e.me); err != nil {
		return fmt.Errorf("campaigning: %w", err)
	}
	// Campaign also returns when the session expired while it waited:
	// confirm the key is still ours before acting as leader.
	rctx, cancel := context.WithTimeout(lctx, e.timeout)
	resp, err := e.cli.Get(rctx, el.Key())
	cancel()
	if err != nil || len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != el.Rev() {
		return fmt.Errorf("won an election whose key is gone: %w", errors.Join(err, lctx.Err()))
	}
	e.terms++
	t := &tenure{term: e.terms, began: e.clock.Now(), grace: e.revokedGrace, gate: e.gate, log: e.log, end: endLead}
	seen, _ := e.gate.seen()
	err = e.lead(lctx, t, store.Leadership{Key: el.Key(), Rev: el.Rev()}, seen.previous)
	if t.loaded {
		e.revokedGrace = 0
	}
	// Resigning hands over at once; it fails harmlessly if the lease is
	// already gone.
	rctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), e.timeout)
	defer cancel()
	if rerr := el.Resign(rctx); rerr != nil {
		e.log.Warn("resigning the lead failed", zap.Error(rerr))
	}
	return err
}

// lead rebuilds the view from etcd and runs the leader-only loops until
// ctx ends (lease lost, shutdown) or t steps down.
func (c *Controller) lead(ctx context.Context, t *tenure, l store.Leadership, previous string) error {
	c.store.Lead(l)
	// From here until the loops are stopped and the view dropped, nothing
	// may write unguarded; Follow makes any straggler fail.
	defer c.store.Follow()
	if err := c.load(ctx, t.grace); err != nil {
		return err
	}
	t.loaded = true
	c.mu.Lock()
	c.tenure = t
	c.gate.setLeading(true)
	w := newWriter(c.store, &c.mu, t.writeFailed)
	c.writes = w
	c.leadEnded = make(chan struct{})
	loaded := c.clock.Now().Sub(t.began)
	me := c.cfg.Advertised()
	if previous == "" {
		previous = "none"
	}
	ev := newEvent(c.clock.Now(), "", "", 0, EventLeaderElected, "controller %s leads (previous leader: %s); %d jobs and %d nodes loaded from etcd in %s",
		me, previous, len(c.jobs), len(c.nodes), loaded.Round(time.Millisecond))
	c.writes.persist(c.store.AppendEvent(ev), nil)
	c.reseal(c.unsealed)
	c.unsealed = nil
	c.reconcile()
	c.mu.Unlock()
	c.log.Info("leading", zap.String("advertise_addr", me), zap.String("previous_leader", previous), zap.Duration("load", loaded))

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { w.run(gctx); return nil })
	g.Go(func() error { c.scheduleLoop(gctx); return nil })
	g.Go(func() error { c.livenessLoop(gctx); return nil })
	g.Go(func() error { c.maintainLoop(gctx); return nil })
	g.Go(func() error {
		c.guard.reverifyLoop(gctx, func(ev *rdzvv1.Event) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.writes.persist(c.store.AppendEvent(ev), nil)
		})
		return nil
	})
	_ = g.Wait()

	c.mu.Lock()
	defer c.mu.Unlock()
	reason := t.close()
	c.writes = nil
	close(c.leadEnded)
	c.leadEnded = nil
	c.store.Follow()
	// Agents must stop hearing from a controller that no longer leads: the
	// streams end, and they find the new leader.
	c.endSessionsLocked()
	c.nodes, c.jobs = map[string]*nodeState{}, map[string]*jobState{}
	c.log.Warn("stopped leading", zap.String("reason", reason))
	if reason != "" {
		return fmt.Errorf("%w: %s", errSteppedDown, reason)
	}
	return fmt.Errorf("leadership lost: %w", context.Cause(ctx))
}

// tenure is one lead of this controller. term, began and grace are set
// when the election wins and never change; loaded is the lead's, which
// runs on the election's goroutine; reason and over are guarded by mu,
// which callers may take while holding Controller.mu (never the other way
// round).
type tenure struct {
	// term numbers the leads of this process, so that work begun under one
	// (a commit in flight) never lands in the next.
	term uint64
	// began is when the lead was won.
	began time.Time
	// grace is added to the reconnect grace of the nodes this lead loads
	// (election.revokedGrace); loaded is set once it loaded them.
	grace  time.Duration
	loaded bool
	gate   *leaderGate
	log    *zap.Logger
	// end ends the lead's context.
	end context.CancelFunc

	mu sync.Mutex
	// reason is why the lead stepped down; "" if it did not.
	reason string
	// over is set once the lead has ended: stepping down is moot.
	over bool
}

// stepDown gives up the lead: leader work stops, and whoever leads next
// rebuilds the view from etcd, so memory never diverges from what was
// persisted.
func (t *tenure) stepDown(reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.over {
		return
	}
	if t.reason == "" {
		t.reason = reason
	}
	t.gate.setLeading(false)
	t.end()
}

// writeFailed handles a state change that could not be persisted (etcd
// refused it, or this controller no longer leads). Memory already holds it
// and whatever was decided after it, none of which may reach anyone;
// stepping down drops that view, and whoever leads next rebuilds it from
// etcd and the agents' reports.
func (t *tenure) writeFailed(what string, err error) {
	log := t.log.Error
	if errors.Is(err, context.Canceled) {
		// The lead itself ended with the write in flight (shutdown, lease
		// lost): expected, and "stopped leading" says why.
		log = t.log.Warn
	}
	log("persisting a state change failed, stepping down", zap.String("change", what), zap.Error(err))
	t.stepDown(what + ": " + err.Error())
}

// close ends the lead for good and says why it stepped down ("" if it
// did not).
func (t *tenure) close() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.over = true
	t.gate.setLeading(false)
	return t.reason
}

// watchLeader keeps the gate's view of who leads current, for redirecting
// clients, until ctx ends: the first-created candidate key leads.
func (e *election) watchLeader(ctx context.Context) {
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, e.timeout)
		resp, err := e.cli.Get(rctx, store.CandidatesPrefix(), clientv3.WithFirstCreate()...)
		cancel()
		if err != nil {
			e.gate.setEtcdErr(err)
			sleep(ctx, e.clock, electionRetry)
			continue
		}
		seen, _ := e.gate.seen()
		view := leaderView{previous: seen.previous}
		if len(resp.Kvs) > 0 {
			// Clients are sent where this says: like any record read back,
			// it is checked first.
			view.addr = string(resp.Kvs[0].Value)
			if _, _, err := net.SplitHostPort(view.addr); err != nil || len(view.addr) > maxShortText {
				e.log.Error("invalid leader address in etcd, not sent to clients", zap.String("key", string(resp.Kvs[0].Key)), zap.String("addr", clip(view.addr)))
				view.addr = ""
			}
			if view.addr != "" && view.addr != e.me {
				view.previous = view.addr
			}
		}
		e.gate.setView(view)
		// Without a leader the etcd member cannot tell whether the key
		// changed, so the watch fails and the next Get reports it.
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := e.cli.Watch(wctx, store.CandidatesPrefix(), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		for wr := range wch {
			if wr.Err() != nil || len(wr.Events) > 0 {
				break
			}
		}
		cancel()
	}
}
