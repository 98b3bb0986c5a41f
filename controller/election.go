package controller

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/rdzv/rdzv/controller/store"
	"github.com/rdzv/rdzv/wire"
)

// electionRetry is the pause before campaigning again after losing the
// lead or failing to reach etcd.
const electionRetry = time.Second

// errSteppedDown is why leader work ends when the controller gives up the
// lead itself (a write it could not persist).
var errSteppedDown = errors.New("stepped down")

// leaderView is what a controller knows about who leads, for telling
// clients where to go.
type leaderView struct {
	// addr is the advertised address of the current leader ("" if none).
	addr string
	// etcdErr is set while etcd cannot be read: no one can lead.
	etcdErr string
	// previous is the last other controller seen leading, for the record
	// of a takeover.
	previous string
}

// elect campaigns for the lead until ctx ends, leading whenever it wins
// and campaigning again whenever it loses the lead. Embedded mode takes the
// same path; it simply always wins.
func (c *Controller) elect(ctx context.Context) {
	if c.cfg.Embedded() {
		c.dropPreviousLead(ctx)
	}
	for ctx.Err() == nil {
		err := c.campaign(ctx)
		if ctx.Err() != nil {
			return
		}
		c.log.Warn("not leading, campaigning again", zap.Error(err), zap.Duration("retry_in", electionRetry))
		timer := c.clock.NewTimer(electionRetry)
		select {
		case <-ctx.Done():
		case <-timer.Chan():
		}
		timer.Stop()
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
func (c *Controller) dropPreviousLead(ctx context.Context) {
	cli := c.store.Client()
	rctx, cancel := context.WithTimeout(ctx, c.cfg.Etcd.RequestTimeout.Duration)
	defer cancel()
	resp, err := cli.Get(rctx, store.ElectionName()+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		c.log.Warn("reading the previous run's leader key failed; waiting out its lease", zap.Error(err))
		return
	}
	for _, kv := range resp.Kvs {
		if kv.Lease == 0 {
			continue
		}
		if _, err := cli.Revoke(rctx, clientv3.LeaseID(kv.Lease)); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			c.log.Warn("revoking the previous run's leader lease failed; waiting out its lease", zap.String("key", string(kv.Key)), zap.Error(err))
			continue
		}
		c.log.Info("revoked the previous run's leader lease", zap.String("key", string(kv.Key)))
		c.revokedGrace = c.cfg.LeaderLeaseTTL.Duration
	}
}

// campaign waits to lead, then leads until the lead is lost.
func (c *Controller) campaign(ctx context.Context) error {
	cli := c.store.Client()
	ttl := int(math.Ceil(c.cfg.LeaderLeaseTTL.Seconds()))
	gctx, cancel := context.WithTimeout(ctx, c.cfg.Etcd.RequestTimeout.Duration)
	lease, err := cli.Grant(gctx, int64(ttl))
	cancel()
	if err != nil {
		c.setEtcdErr(err)
		return fmt.Errorf("granting the leader lease: %w", err)
	}
	c.setEtcdErr(nil)
	// The session outlives ctx so that Close can still revoke the lease on
	// shutdown: a follower then takes over at once instead of after the TTL.
	// The TTL also bounds how long Close tries.
	sess, err := concurrency.NewSession(cli, concurrency.WithLease(lease.ID), concurrency.WithTTL(ttl),
		concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		return fmt.Errorf("keeping the leader lease alive: %w", err)
	}
	defer func() {
		if err := sess.Close(); err != nil {
			c.log.Warn("revoking the leader lease failed; a follower takes over when it expires", zap.Error(err))
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
	if err := el.Campaign(lctx, c.cfg.Advertised()); err != nil {
		return fmt.Errorf("campaigning: %w", err)
	}
	// Campaign also returns when the session expired while it waited:
	// confirm the key is still ours before acting as leader.
	rctx, cancel := context.WithTimeout(lctx, c.cfg.Etcd.RequestTimeout.Duration)
	resp, err := cli.Get(rctx, el.Key())
	cancel()
	if err != nil || len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != el.Rev() {
		return fmt.Errorf("won an election whose key is gone: %w", errors.Join(err, lctx.Err()))
	}
	err = c.lead(lctx, endLead, store.Leadership{Key: el.Key(), Rev: el.Rev()}, c.leaderView().previous)
	// Resigning hands over at once; it fails harmlessly if the lease is
	// already gone.
	rctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), c.cfg.Etcd.RequestTimeout.Duration)
	defer cancel()
	if rerr := el.Resign(rctx); rerr != nil {
		c.log.Warn("resigning the lead failed", zap.Error(rerr))
	}
	return err
}

// lead rebuilds the view from etcd and runs the leader-only loops until
// ctx ends (lease lost, shutdown) or the controller steps down.
func (c *Controller) lead(ctx context.Context, stepDown context.CancelFunc, l store.Leadership, previous string) error {
	begin := c.clock.Now()
	c.store.Lead(l)
	// From here until the loops are stopped and the view dropped, nothing
	// may write unguarded; Follow makes any straggler fail.
	defer c.store.Follow()
	if err := c.load(ctx); err != nil {
		return err
	}
	c.mu.Lock()
	c.term++
	c.stepDown = stepDown
	c.electedAt = begin
	c.leading.Store(true)
	c.refreshHealth()
	w := newWriter(c.store, &c.mu, c.writeFailed)
	c.writes = w
	c.leadEnded = make(chan struct{})
	loaded := c.clock.Now().Sub(begin)
	me := c.cfg.Advertised()
	if previous == "" {
		previous = "none"
	}
	ev := c.event("", "", 0, EventLeaderElected, "controller %s leads (previous leader: %s); %d jobs and %d nodes loaded from etcd in %s",
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
	g.Go(func() error { c.reverifyLoop(gctx); return nil })
	_ = g.Wait()

	c.mu.Lock()
	defer c.mu.Unlock()
	c.leading.Store(false)
	c.refreshHealth()
	c.stepDown = nil
	c.writes = nil
	close(c.leadEnded)
	c.leadEnded = nil
	c.store.Follow()
	// Agents must stop hearing from a controller that no longer leads: the
	// streams end, and they find the new leader.
	c.endSessionsLocked()
	c.nodes, c.jobs = map[string]*nodeState{}, map[string]*jobState{}
	reason := c.stepDownReason
	c.stepDownReason = ""
	c.log.Warn("stopped leading", zap.String("reason", reason))
	if reason != "" {
		return fmt.Errorf("%w: %s", errSteppedDown, reason)
	}
	return fmt.Errorf("leadership lost: %w", context.Cause(ctx))
}

// stepDownLocked gives up the lead: leader work stops, and whoever leads
// next rebuilds the view from etcd, so memory never diverges from what was
// persisted. Callers hold c.mu.
func (c *Controller) stepDownLocked(reason string) {
	if c.stepDown == nil {
		return
	}
	if c.stepDownReason == "" {
		c.stepDownReason = reason
	}
	c.leading.Store(false)
	c.refreshHealth()
	c.stepDown()
}

// writeFailed handles a state change that could not be persisted (etcd
// refused it, or this controller no longer leads). Memory already holds it
// and whatever was decided after it, none of which may reach anyone;
// stepping down drops that view, and whoever leads next rebuilds it from
// etcd and the agents' reports. Callers hold c.mu.
func (c *Controller) writeFailed(what string, err error) {
	log := c.log.Error
	if errors.Is(err, context.Canceled) {
		// The lead itself ended with the write in flight (shutdown, lease
		// lost): expected, and "stopped leading" says why.
		log = c.log.Warn
	}
	log("persisting a state change failed, stepping down", zap.String("change", what), zap.Error(err))
	c.stepDownLocked(what + ": " + err.Error())
}

// watchLeader keeps c's view of who leads current, for redirecting
// clients, until ctx ends: the first-created candidate key leads.
func (c *Controller) watchLeader(ctx context.Context) {
	cli := c.store.Client()
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, c.cfg.Etcd.RequestTimeout.Duration)
		resp, err := cli.Get(rctx, store.CandidatesPrefix(), clientv3.WithFirstCreate()...)
		cancel()
		if err != nil {
			c.setEtcdErr(err)
			c.sleep(ctx, electionRetry)
			continue
		}
		view := leaderView{previous: c.leaderView().previous}
		if len(resp.Kvs) > 0 {
			// Clients are sent where this says: like any record read back,
			// it is checked first.
			view.addr = string(resp.Kvs[0].Value)
			if _, _, err := net.SplitHostPort(view.addr); err != nil || len(view.addr) > maxShortText {
				c.log.Error("invalid leader address in etcd, not sent to clients", zap.String("key", string(resp.Kvs[0].Key)), zap.String("addr", clip(view.addr)))
				view.addr = ""
			}
			if view.addr != "" && view.addr != c.cfg.Advertised() {
				view.previous = view.addr
			}
		}
		c.view.Store(&view)
		c.refreshHealth()
		// Without a leader the etcd member cannot tell whether the key
		// changed, so the watch fails and the next Get reports it.
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := cli.Watch(wctx, store.CandidatesPrefix(), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		for wr := range wch {
			if wr.Err() != nil || len(wr.Events) > 0 {
				break
			}
		}
		cancel()
	}
}

func (c *Controller) sleep(ctx context.Context, d time.Duration) {
	timer := c.clock.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.Chan():
	}
}

func (c *Controller) leaderView() leaderView {
	if v := c.view.Load(); v != nil {
		return *v
	}
	return leaderView{}
}

// setEtcdErr records that etcd failed (nil: that it answered).
func (c *Controller) setEtcdErr(err error) {
	v := c.leaderView()
	v.etcdErr = ""
	if err != nil {
		v.etcdErr = err.Error()
	}
	c.view.Store(&v)
	c.refreshHealth()
}

// gate refuses every call while this controller does not lead, telling
// the client where the leader is when it knows.
func (c *Controller) gate() error {
	if c.leading.Load() {
		return nil
	}
	v := c.leaderView()
	me := c.cfg.Advertised()
	switch {
	case v.etcdErr != "":
		return wire.Error(wire.ReasonEtcdUnavailable, "", fmt.Sprintf(
			"etcd unavailable (no quorum?): no controller can lead, changes are refused; running jobs continue: %s", v.etcdErr))
	case v.addr != "" && v.addr != me:
		return wire.Error(wire.ReasonNotLeader, v.addr, fmt.Sprintf("controller %s is a follower; the leader is %s", me, v.addr))
	}
	return wire.Error(wire.ReasonNoLeader, "", fmt.Sprintf("controller %s does not lead yet (election or start-up under way); retry", me))
}

func (c *Controller) unaryGate(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if publicMethod(info.FullMethod) {
		return handler(ctx, req)
	}
	if err := c.gate(); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (c *Controller) streamGate(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if publicMethod(info.FullMethod) {
		return handler(srv, ss)
	}
	if err := c.gate(); err != nil {
		return err
	}
	return handler(srv, ss)
}
