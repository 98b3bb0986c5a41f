// Package controller is rdzv-controller: the node registry, rendezvous,
// job lifecycle and the gRPC API, with durable state in etcd.
package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/controller/lifecycle"
	"github.com/rdzv/rdzv/controller/store"
	"github.com/rdzv/rdzv/health"
	"github.com/rdzv/rdzv/internal/httpserve"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/rendezvous"
	"github.com/rdzv/rdzv/wire"
)

// nodeTable is the nodes this lead knows, by name, and the questions asked
// of all of them (scheduling candidates, gossip evidence, ring and replica
// peers). Guarded by Controller.mu.
type nodeTable map[string]*nodeState

// jobTable is the jobs this lead knows, by name. Guarded by Controller.mu.
type jobTable map[string]*jobState

// Controller is the rdzv-controller daemon.
type Controller struct {
	cfg   Config
	log   *zap.Logger
	clock clockwork.Clock
	// listener, when set, replaces listening on cfg.Listen (tests).
	listener net.Listener
	// guard is the controller's TLS, authentication and deny-list.
	guard *guard

	// metrics count decisions (metrics.go); registry is all the HTTP
	// listener exports; http is that listener, nil when off.
	metrics  *metrics
	registry *prometheus.Registry
	http     *httpserve.Server
	// probe is the readiness the HTTP /readyz and grpc.health.v1 tell.
	probe *probe

	store *store.Store
	// gate is whether this controller leads, and who does if not: the
	// API serves only while it leads.
	gate *leaderGate
	// kick wakes the scheduler after anything that may let a job start.
	kick chan struct{}
	// peersKick wakes the liveness loop when a gossip view reports a node
	// unreachable that it did not before.
	peersKick chan struct{}
	// hangKick wakes the liveness loop for a hangPass: a job's hang
	// deadline comes before the loop's next hang wake (wakeHangPassBy).
	hangKick chan struct{}
	// ready is closed once the gRPC server accepts connections.
	ready chan struct{}
	addr  net.Addr

	mu    sync.Mutex
	nodes nodeTable
	// hangWake is when the liveness loop runs its next hangPass, zero if
	// at none (hangPass, wakeHangPassBy).
	hangWake time.Time
	// carriers are the relays' Carry calls this lead serves (carry.go).
	carriers map[*carrier]struct{}
	// seeds are the nodes that registered with gossip last (gossipSeeds).
	seeds seedRing
	jobs  jobTable
	// standbys are the warm standbys agents were told to keep (standby.go).
	standbys standbyTable
	// tenure is the current lead, or the last one once it ended; nil
	// until this controller first leads.
	tenure *tenure
	// writes persists this lead's decisions (see writer.go); nil while not
	// leading.
	writes *writer
	// watches counts the event watches open (see watch.go).
	watches atomic.Int64
	// leadEnded is closed when the current lead ends (event watches end
	// with it); nil while not leading.
	leadEnded chan struct{}
	// unsealed are the jobs load found not sealed with the primary key,
	// resealed once the lead's writer runs.
	unsealed []string
	// generationFloor is the highest generation of the jobs deleted so far
	// (see dropJob).
	generationFloor uint64
	// lag is the controller's own recent lag (lag.go), credited to every
	// node's silence.
	lag *lagMeter
}

type nodeState struct {
	// rec is the node's record without its registration, info.
	rec     *rdzvv1.Node
	info    nodeInfo
	session *session
	// lastSeen is kept for nodes without a session (just loaded, or
	// disconnected) so the liveness clock keeps running for them.
	lastSeen time.Time
	// view is what this node's gossip last reported about its peers.
	view *gossipView
	// fencedBy is when a lost node's agent has certainly killed its own
	// workers if it is alive but cut off: its self-fencing deadline.
	fencedBy time.Time
	// lost is what fencedBy was computed from while its watchers' word
	// may still shorten it (see tightenFencing); nil otherwise.
	lost *lostFencing
	// hiccup is set while the node is silent to the controller yet its
	// peers still reach it.
	hiccup bool
	// accused is set while connected peers report the node unreachable;
	// doubtedUntil ends the distrust of that word after peers took it
	// back without the node being lost (health.Silence.Doubted).
	accused      bool
	doubtedUntil time.Time
	// graceUntil keeps a node loaded at start from being declared lost
	// before its agent had a fair chance to reconnect.
	graceUntil time.Time
	// losses are when the node was lost while running a job, within the
	// flaky_nodes window (in memory: a controller restart forgives).
	losses []time.Time
	// restartHold is until when a restarting agent's node is spared whatever
	// its peers say: they lost it too, since gossip restarts with the agent,
	// while its workers run on under their shims.
	restartHold time.Time
	// heard is set once the node's agent registered with this leader.
	heard bool
	// health is the node's health check verdicts as its agent last
	// reported them; unhealthy is its failing ones in words, empty when
	// all pass (worked out once per report, not per scheduling pass).
	health    []*rdzvv1.HealthCheckResult
	unhealthy string
	// job and generation are set while the node is reserved for or running
	// a job; the node is busy until its worker's exit is reported.
	job        string
	generation uint64
}

type jobState struct {
	rec *rdzvv1.Job
	// members is the current round and its workers' reports.
	members lifecycle.Members
	// Scheduling state for a pending job, in memory only.
	lastCall     rendezvous.LastCall
	committing   bool
	pendingSince time.Time
	// probe is the next round's master port, probed ahead (startProbe).
	probe *masterProbe
	// progressed is set once the current generation reported a new step or
	// checkpoint; a failure without it counts toward a crash loop.
	progressed bool
	// reportsSteps is set once the job reported a training step: then a
	// restarted generation counts as training again at its first report.
	reportsSteps bool
	// catalog holds the steps of the checkpoint catalog, oldest first, so
	// that it can be kept to catalogSize entries.
	catalog []uint64
	// spares are the idle nodes held for the job now (nodes.spares), as
	// the last scheduling pass picked them.
	spares []string
	// excluded are the nodes the round smoke test left out of this job,
	// with its verdicts.
	excluded map[string]string
	// failedAt is when the last attempt failed, until the next round
	// commits; recommittedAt is when a restarted generation committed,
	// until its first step. In memory, for the recovery histograms.
	failedAt, recommittedAt time.Time
	// training is the current generation's phase, step times and metrics
	// (progress.go).
	training training
	// memHeld is what each node holds of the job's in-memory checkpoints
	// (memckpt.go), in memory only; memSkip are the steps whose fetch
	// failed, never picked again; memPlan is the current generation's
	// in-memory resume, nil when it resumed otherwise; memSealed is what
	// was held of earlier generations when the current one committed
	// (sealMemory); memWorld is each generation's world size (noteWorld).
	memHeld   map[string][]*rdzvv1.MemoryHeld
	memWorld  map[uint64]uint32
	memSealed map[memKey][]uint32
	memSkip   map[memKey]bool
	memPlan   *memPlan
	// growCheck marks a running job to be checked for growth on the next
	// scheduling pass (noteGrowable); growTo is the width a grow restart
	// aims for, until its round commits; grew is set from a grow until
	// the restarted generation trains (it is no recovery from a fault).
	growCheck bool
	growTo    int
	grew      bool
	// growSeen is when growth checks first saw each free eligible node
	// (joinWait); ckptEvery is the time between the job's last two
	// checkpoints of one generation (or from its start to its first), 0
	// until known. For a job whose in-memory state is replicated, a new
	// in-memory step is as good a moment to grow (noteMemoryStep):
	// memNewest is the current generation's newest one heard of, at
	// memNewestAt, and memEvery the time between the last two new ones.
	growSeen    map[string]time.Time
	ckptEvery   time.Duration
	memNewest   uint64
	memNewestAt time.Time
	memEvery    time.Duration
}

// Option adjusts a Controller for tests.
type Option func(*Controller)

// WithClock replaces the wall clock.
func WithClock(c clockwork.Clock) Option { return func(ctl *Controller) { ctl.clock = c } }

// WithListener serves on l instead of listening on cfg.Listen.
func WithListener(l net.Listener) Option { return func(ctl *Controller) { ctl.listener = l } }

// New builds a controller; Run starts it.
func New(cfg Config, log *zap.Logger, opts ...Option) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid controller config: %w", err)
	}
	c := &Controller{
		cfg:       cfg,
		log:       log,
		clock:     clockwork.NewRealClock(),
		kick:      make(chan struct{}, 1),
		peersKick: make(chan struct{}, 1),
		hangKick:  make(chan struct{}, 1),
		ready:     make(chan struct{}),
		nodes:     map[string]*nodeState{},
		carriers:  map[*carrier]struct{}{},
		jobs:      map[string]*jobState{},

		lag: newLagMeter(cfg.Heartbeat.Timeout.Duration, cfg.Heartbeat.Interval.Duration, log.Named("liveness")),

		metrics:  newMetrics(),
		registry: httpserve.NewRegistry(),
	}
	for _, o := range opts {
		o(c)
	}
	c.gate = newLeaderGate(cfg.Advertised())
	c.probe = newProbe(c.gate, c.clock, cfg.Etcd.RequestTimeout.Duration)
	c.gate.changed = c.probe.refresh
	g, err := newGuard(cfg, c.clock, log, c.metrics)
	if err != nil {
		return nil, err
	}
	c.guard = g
	c.registry.MustRegister(append(c.metrics.collectors(), stateCollector{c})...)
	if cfg.HTTP.Enabled() {
		s, err := httpserve.New(cfg.HTTP, c.registry, c.probe.readiness, log.Named("http"))
		if err != nil {
			return nil, err
		}
		c.http = s
	}
	return c, nil
}

// Ready is closed when the controller serves; Addr is valid from then on.
func (c *Controller) Ready() <-chan struct{} { return c.ready }

// Addr is the address the gRPC server listens on.
func (c *Controller) Addr() net.Addr { return c.addr }

// Leading reports whether this controller leads and serves the API.
func (c *Controller) Leading() bool { return c.gate.leading() }

// Run connects to etcd and serves until ctx ends, campaigning for the lead
// all along: it leads (loads state, runs jobs) when it wins, and redirects
// clients to the leader while it stands by.
func (c *Controller) Run(ctx context.Context) error {
	keys, err := openKeyring(c.cfg, c.clock.Now(), c.log)
	if err != nil {
		return err
	}
	// Metrics and health answer from the start: /readyz says why the
	// controller is not ready while etcd starts.
	if c.http != nil {
		stopHTTP, err := c.http.Start(ctx)
		if err != nil {
			return err
		}
		defer func() {
			if err := stopHTTP(); err != nil {
				c.log.Warn("http listener failed", zap.Error(err))
			}
		}()
	}
	cli, closeEtcd, err := connectEtcd(ctx, c.cfg, c.log, c.metrics.etcdInterceptor)
	if err != nil {
		return err
	}
	defer closeEtcd()
	c.store = store.New(cli, c.cfg.Etcd.RequestTimeout.Duration, keys, c.cfg.maxTxnOps())

	lis := c.listener
	if lis == nil {
		if lis, err = net.Listen("tcp", c.cfg.Listen); err != nil {
			return fmt.Errorf("listening on %s: %w", c.cfg.Listen, err)
		}
	}
	// Interceptors chain in order: authentication and authorization first,
	// so that an unknown caller learns nothing from validation errors or
	// leader redirects; then validation; then the follower's redirect.
	// The gRPC metrics come first, so that refused calls count too.
	srv := grpc.NewServer(append(append(append([]grpc.ServerOption{
		grpc.ChainUnaryInterceptor(c.metrics.grpc.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(c.metrics.grpc.StreamServerInterceptor()),
	}, c.guard.serverOptions(c.cfg.Listen)...),
		grpc.ChainUnaryInterceptor(unaryGuard(c.log.Named("api"))),
		grpc.ChainStreamInterceptor(streamGuard(c.log.Named("api"))),
		grpc.ChainUnaryInterceptor(c.gate.unary),
		grpc.ChainStreamInterceptor(c.gate.stream),
	), wire.StreamServerOptions()...)...)
	rdzvv1.RegisterAgentServiceServer(srv, &agentService{c: c})
	rdzvv1.RegisterRelayServiceServer(srv, &relayService{c: c})
	rdzvv1.RegisterJobServiceServer(srv, &jobService{c: c})
	rdzvv1.RegisterNodeServiceServer(srv, &nodeService{c: c})
	rdzvv1.RegisterCertificateServiceServer(srv, &certificateService{c: c})
	rdzvv1.RegisterServerServiceServer(srv, &serverService{c: c})
	healthpb.RegisterHealthServer(srv, c.probe.health)
	c.metrics.grpc.InitializeMetrics(srv)
	c.addr = lis.Addr()
	c.log.Info("controller serving", zap.Stringer("addr", c.addr), zap.String("advertise_addr", c.cfg.Advertised()), zap.Bool("embedded_etcd", c.cfg.Embedded()))
	close(c.ready)

	g, gctx := errgroup.WithContext(ctx)
	serve := func(srv *grpc.Server, lis net.Listener) func() error {
		return func() error {
			if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				return fmt.Errorf("serving grpc: %w", err)
			}
			return nil
		}
	}
	// With TLS, the splitter makes the handshakes and hands unverified
	// clients to a server of their own (preauth.go).
	var pre *grpc.Server
	if c.guard.tls == nil {
		g.Go(serve(srv, lis))
	} else {
		sp := newSplitter(lis, c.guard.handshakeCreds(keys), func(chain pki.Chain) error {
			_, err := c.guard.auth.verify(chain, pki.ClientVerification{})
			return err
		}, c.guard.conns, c.clock, c.log.Named("auth"))
		pre = grpc.NewServer(append(preauthServerOptions(),
			grpc.ChainUnaryInterceptor(c.metrics.grpc.UnaryServerInterceptor()),
			grpc.ChainStreamInterceptor(c.metrics.grpc.StreamServerInterceptor()),
			grpc.UnknownServiceHandler(sp.refuse))...)
		healthpb.RegisterHealthServer(pre, c.probe.health)
		g.Go(func() error { return sp.run(gctx) })
		g.Go(serve(srv, sp.api))
		g.Go(serve(pre, sp.pre))
	}
	el := &election{
		cli: cli, timeout: c.cfg.Etcd.RequestTimeout.Duration, ttl: c.cfg.LeaderLeaseTTL.Duration,
		embedded: c.cfg.Embedded(), me: c.cfg.Advertised(), gate: c.gate, clock: c.clock, log: c.log.Named("election"),
		lead: c.lead,
	}
	g.Go(func() error { el.watchLeader(gctx); return nil })
	g.Go(func() error { el.run(gctx); return nil })
	g.Go(func() error { c.probe.probeEtcd(gctx, cli); return nil })
	g.Go(func() error {
		<-gctx.Done()
		c.probe.stop()
		// Agent streams never end by themselves; end them so the graceful
		// stop only waits for operator calls in flight.
		c.endSessions()
		stopGRPC(5*time.Second, srv, pre)
		return nil
	})
	err = g.Wait()
	c.log.Info("controller stopped")
	return err
}

func (c *Controller) endSessions() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.endSessionsLocked()
}

func (c *Controller) endSessionsLocked() {
	for ca := range c.carriers {
		ca.end(errLeadEnded)
	}
	for _, ns := range c.nodes {
		if ns.session != nil {
			ns.session.cancel()
		}
	}
}

// stopGRPC drains in-flight calls of each server (nil ones skipped) but
// never waits on streams (agents keep theirs open forever, probers their
// health watches) for longer than grace.
func stopGRPC(grace time.Duration, servers ...*grpc.Server) {
	var wg sync.WaitGroup
	for _, srv := range servers {
		if srv == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			done := make(chan struct{})
			go func() { srv.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-time.After(grace):
				srv.Stop()
				<-done
			}
		}()
	}
	wg.Wait()
}

// reconnectGrace is added to the heartbeat timeout for nodes loaded at
// start: agents back off up to 4s between reconnect attempts (agent's
// maxBackoff; 10s before this release, so an upgrade that starts with the
// controller still finds older agents), so after a long controller outage
// a healthy agent may take that long to come back. Declaring it lost
// sooner would fail healthy jobs.
const reconnectGrace = 10 * time.Second

// load rebuilds the in-memory view from etcd when this controller takes the
// lead, from records validated first (see screen). Nodes start with a fresh
// liveness clock plus reconnectGrace, so a new leader never declares a node
// lost merely because it just started.
func (c *Controller) load(ctx context.Context, extraGrace time.Duration) error {
	snap, err := c.store.Load(ctx)
	if err != nil {
		return fmt.Errorf("loading state from etcd: %w", err)
	}
	revoked, badRevocations, err := c.store.Revocations(ctx)
	if err != nil {
		return fmt.Errorf("loading state from etcd: %w", err)
	}
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.guard.loadRevocations(revoked, badRevocations)
	c.screen(snap, now)
	c.nodes, c.jobs = map[string]*nodeState{}, map[string]*jobState{}
	grace := reconnectGrace + c.cfg.Heartbeat.Timeout.Duration + extraGrace
	for name, v := range snap.Nodes {
		ni, err := newNodeInfo(v.Value.GetInfo())
		if err != nil {
			// Unreachable, as a record that decoded re-encodes: were it
			// not, the node is unknown until it registers again.
			c.log.Error("node record ignored", zap.String("node", name), zap.Error(err))
			continue
		}
		v.Value.Info = nil
		ns := &nodeState{rec: v.Value, info: ni, lastSeen: now, graceUntil: now.Add(grace)}
		if hold := v.Value.GetRestartHoldUntil(); hold != nil {
			// Set by the previous leader from its own clock: controllers'
			// clocks are assumed to agree to well within a hold (seconds
			// to minutes). No agent asks for longer than maxRestartHold.
			ns.restartHold = hold.AsTime()
			if limit := now.Add(maxRestartHold); ns.restartHold.After(limit) {
				ns.restartHold = limit
			}
		}
		if v.Value.GetState() == rdzvv1.NodeState_NODE_STATE_LOST {
			// The leader that declared it lost kept its fencing deadline in
			// memory only, and this one cannot know when that leader last
			// heard it (it may even have reconnected, unrecorded): it is a
			// node this leader never heard, silent since the election.
			ns.fencedBy = c.cfg.Heartbeat.policy().FencedBy(health.Loss{
				At: now, LastSeen: now, ElectedAt: now, Gossips: ni.gossipAddr != "",
			})
		}
		c.nodes[name] = ns
	}
	for name, v := range snap.Jobs {
		js := &jobState{rec: v.Value, pendingSince: now, catalog: snap.Checkpoints[name]}
		js.members.Reset(snap.Rounds[name], snap.Workers[name])
		c.jobs[name] = js
		round := js.members.Round()
		if !activeJob(js.rec.GetState()) || round == nil || round.GetGeneration() != js.rec.GetGeneration() {
			continue
		}
		for _, a := range round.GetNodes() {
			if ns := c.nodes[a.GetNode()]; ns != nil && !lifecycle.TerminalWorker(js.members.Worker(a.GetNode()).GetState()) {
				ns.job, ns.generation = name, js.rec.GetGeneration()
			}
		}
	}
	c.unsealed = snap.Unsealed
	c.generationFloor = snap.GenerationFloor
	c.log.Info("state loaded", zap.Int("nodes", len(c.nodes)), zap.Int("jobs", len(c.jobs)))
	return nil
}

// reconcile moves on jobs whose next transition a previous leader decided
// but did not persist (every worker exited, yet the job still RUNNING).
// Callers hold c.mu.
func (c *Controller) reconcile() {
	for _, js := range c.jobs {
		if activeJob(js.rec.GetState()) && js.members.Round() != nil && js.members.Round().GetGeneration() == js.rec.GetGeneration() {
			c.advanceJob(js, js.members.Round().GetNodes())
		}
	}
}

func (c *Controller) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func activeJob(s rdzvv1.JobState) bool {
	return s == rdzvv1.JobState_JOB_STATE_RUNNING || s == rdzvv1.JobState_JOB_STATE_STOPPING || s == rdzvv1.JobState_JOB_STATE_RECOVERING ||
		s == rdzvv1.JobState_JOB_STATE_FAILED || s == rdzvv1.JobState_JOB_STATE_STOPPED
}

// newEvent is an event of kind at now, its message formatted.
func newEvent(now time.Time, job, node string, generation uint64, kind, format string, args ...any) *rdzvv1.Event {
	return &rdzvv1.Event{
		Time: timestamppb.New(now), Job: job, Node: node, Generation: generation,
		Kind: kind, Message: fmt.Sprintf(format, args...),
	}
}

// Event kinds, stable for `rdzvctl events -o json`.
const (
	EventNodeRegistered      = "node_registered"
	EventNodeLost            = "node_lost"
	EventJobSubmitted        = lifecycle.EventJobSubmitted
	EventRendezvousCommitted = lifecycle.EventRendezvousCommitted
	EventWorkersRunning      = lifecycle.EventWorkersRunning
	EventWorkersExited       = lifecycle.EventWorkersExited
	EventWorkerFailed        = lifecycle.EventWorkerFailed
	EventJobSucceeded        = lifecycle.EventJobSucceeded
	EventJobFailed           = lifecycle.EventJobFailed
	EventJobStopping         = lifecycle.EventJobStopping
	EventJobStopped          = lifecycle.EventJobStopped
	EventAttemptFailed       = lifecycle.EventAttemptFailed
	EventCheckpoint          = lifecycle.EventCheckpoint
	EventNodeCordoned        = "node_cordoned"
	EventNodeUncordoned      = "node_uncordoned"
	EventGPUFault            = "gpu_fault"
	EventAgentRestarting     = "agent_restarting"
	EventLeaderElected       = "leader_elected"
	EventCertExpiring        = "certificate_expiring"
	EventJobDeleted          = "job_deleted"
	EventNodeDeleted         = "node_deleted"
	EventCertRevoked         = "certificate_revoked"
	EventTLSReloadRefused    = "tls_reload_refused"
	EventNodeUnhealthy       = "node_unhealthy"
	EventNodeHealthy         = "node_healthy"
	EventPreflightExcluded   = lifecycle.EventPreflightExcluded
	EventJobGrowing          = lifecycle.EventJobGrowing
	EventRecovered           = lifecycle.EventRecovered
)
