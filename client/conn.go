package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// maxHops bounds how many redirects one call follows, so two controllers
// that each name the other (briefly possible during an election) cannot
// keep a call bouncing.
const maxHops = 4

// Conn sends each call to the leading controller among a list of
// addresses, following redirects, so the generated clients work unchanged
// over a set of replicas. The address that last answered is tried first.
// Client is built on it.
type Conn struct {
	addrs []string
	// creds secures the connection to one address (TLS checks the
	// certificate against the host dialled).
	creds credentialsFunc
	opts  []grpc.DialOption
	log   *zap.Logger
	// relays are the addresses in addrs that are relays (Config.Relays).
	relays map[string]bool
	// tlsFor is the TLS configuration for an address, nil without TLS; an
	// agent's stream to a relay goes in frames over a connection of its
	// own (dialFramed), dialled with dial.
	tlsFor func(addr string) (*tls.Config, error)
	dial   func(ctx context.Context, addr string) (net.Conn, error)

	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	leader string
	// parked are connections to relays between streams (park).
	parked map[string]*parked
}

var _ grpc.ClientConnInterface = (*Conn)(nil)

// credentialsFunc gives the transport security for a controller address.
type credentialsFunc func(addr string) (credentials.TransportCredentials, error)

// newConn prepares connections to addrs (at least one); nothing is
// dialled until a call.
func newConn(addrs []string, creds credentialsFunc, log *zap.Logger, opts ...grpc.DialOption) *Conn {
	return &Conn{addrs: addrs, creds: creds, log: log, opts: opts, dial: defaultDial, conns: map[string]*grpc.ClientConn{}, parked: map[string]*parked{}}
}

// framedTo says whether an agent's stream to addr goes in frames: addr is
// a relay, and the client has TLS (Config.Validate requires it with
// relays).
func (c *Conn) framedTo(addr string) bool {
	return c.relays[addr] && c.tlsFor != nil
}

// Close closes every connection.
func (c *Conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, cc := range c.conns {
		errs = append(errs, cc.Close())
	}
	c.conns = map[string]*grpc.ClientConn{}
	c.closeParked()
	return errors.Join(errs...)
}

// Leader is the address that last served a call, or "".
func (c *Conn) Leader() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader
}

// Relayed says whether the address that last served a call is a relay.
func (c *Conn) Relayed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.relays[c.leader]
}

// served records that addr served a call: it leads, or is a relay that
// reached the leader.
func (c *Conn) served(addr string) {
	c.mu.Lock()
	prev := c.leader
	c.leader = addr
	c.mu.Unlock()
	switch {
	case prev == addr:
	case c.relays[addr]:
		c.log.Info("calling through a relay", zap.String("relay", addr), zap.String("previous", prev))
	default:
		c.log.Info("calling the leading controller", zap.String("controller", addr), zap.String("previous", prev))
	}
}

// refused drops the connection to addr if a controller refused the
// certificate it was opened with (Unauthenticated): every call on it would
// be refused alike, since calls reuse the connection's handshake. The next
// call handshakes anew, with the certificate on disk by then, renewed one
// hopes. Other errors leave the connection to gRPC's reconnecting.
func (c *Conn) refused(addr string, cc *grpc.ClientConn, err error) {
	// A framed stream (cc nil) had its connection to itself.
	if cc != nil && status.Code(err) == codes.Unauthenticated {
		c.drop(addr, cc)
	}
}

// forget drops the connection to addr, a controller that a client with
// relays could not reach. Left alone, gRPC would dial it again in the
// background until it answered, and then hold it idle: the client is back
// through its relay by then. In a cold start through relays, every agent
// that went around its relay while the controller started would make a
// handshake, and hold an idle connection, at the controller while it
// registers the others. The next walk that needs the controller dials it afresh. Relays, which go
// first, and a client without relays, which has nothing else, keep theirs
// reconnecting.
func (c *Conn) forget(addr string, cc *grpc.ClientConn) {
	if len(c.relays) > 0 && !c.relays[addr] && cc.GetState() != connectivity.Ready {
		c.drop(addr, cc)
	}
}

// drop closes cc and forgets it as the connection to addr, unless a newer
// one replaced it: the next call to addr dials afresh.
func (c *Conn) drop(addr string, cc *grpc.ClientConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conns[addr] == cc {
		delete(c.conns, addr)
		_ = cc.Close()
	}
}

func (c *Conn) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc := c.conns[addr]; cc != nil {
		return cc, nil
	}
	creds, err := c.creds(addr)
	if err != nil {
		return nil, err
	}
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithInitialWindowSize(wire.FlowWindow),
		grpc.WithInitialConnWindowSize(wire.FlowWindow),
	}, c.opts...)...)
	if err != nil {
		return nil, fmt.Errorf("controller address %q: %w", addr, err)
	}
	c.conns[addr] = cc
	return cc, nil
}

// Invoke implements grpc.ClientConnInterface.
func (c *Conn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	return c.each(ctx, false, func(ctx context.Context, _ string, cc *grpc.ClientConn) error {
		return cc.Invoke(ctx, method, args, reply, opts...)
	})
}

// NewStream implements grpc.ClientConnInterface. A controller's refusal
// arrives with the first response, so the stream is opened, and moved to
// another controller if need be, on the first receive (see stream).
func (c *Conn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return &stream{c: c, ctx: ctx, desc: desc, method: method, opts: opts}, nil
}

// Backoff between walks while an election is under way.
const (
	electionRetryMin = 200 * time.Millisecond
	electionRetryMax = time.Second
)

// each runs call against the controllers until one serves it. While no
// controller leads (an election: it ends within the leader lease), it walks
// them again until the caller's deadline, so a failover is invisible to a
// caller willing to wait: a refused call changed nothing, so repeating it
// is safe. Without a deadline it does not wait. A framed call (an agent's
// stream) goes to a relay with cc nil (framedTo); other calls skip the
// relays.
func (c *Conn) each(ctx context.Context, framed bool, call func(ctx context.Context, addr string, cc *grpc.ClientConn) error) error {
	_, hasDeadline := ctx.Deadline()
	wait := electionRetryMin
	for {
		electing, err := c.walk(ctx, framed, call)
		if !electing || !hasDeadline {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, electionRetryMax)
	}
}

// walk tries call against the controllers in turn until one serves it:
// the relays first (Config.Relays), then the last leader, then redirect
// hints, then the configured list. Relays go first every time, so that an
// agent that went around a failed relay comes back to it when it next
// reconnects.
// An answer that is not a controller's refusal or a transport failure
// (success, NotFound, InvalidArgument...) ends the walk. electing says that
// none served because an election is under way: a controller said no one
// leads, or named a leader that could not be reached (the one that just
// died, which followers see leading until its lease runs out).
func (c *Conn) walk(ctx context.Context, framed bool, call func(ctx context.Context, addr string, cc *grpc.ClientConn) error) (electing bool, err error) {
	relaysOnly := ctx.Value(relaysOnlyKey{}) != nil
	c.mu.Lock()
	// The relays first: addrs starts with them.
	queue := append([]string{}, c.addrs...)
	switch {
	case relaysOnly:
		queue = queue[:len(c.relays)]
	case c.leader != "":
		queue = slices.Insert(queue, len(c.relays), c.leader)
	}
	c.mu.Unlock()
	if len(queue) == 0 {
		return false, status.Error(codes.Unavailable, "no relays configured")
	}
	tried, down, named := map[string]bool{}, map[string]bool{}, map[string]bool{}
	var refusal, unreachable error
	noLeader, skipped := false, false
	hops := 0
	for len(queue) > 0 && ctx.Err() == nil {
		addr := queue[0]
		queue = queue[1:]
		if tried[addr] {
			continue
		}
		tried[addr] = true
		var cc *grpc.ClientConn
		switch {
		case c.relays[addr] && !framed:
			// A relay carries agents' streams only.
			skipped = true
			continue
		case !framed || !c.framedTo(addr):
			if cc, err = c.conn(addr); err != nil {
				return false, err
			}
			if !connected(ctx, cc, untried(queue, tried)+1) {
				unreachable, down[addr] = status.Errorf(codes.Unavailable, "no connection to %s in time", addr), true
				c.forget(addr, cc)
				continue
			}
		}
		err = call(ctx, addr, cc)
		if err == nil {
			c.served(addr)
			return false, nil
		}
		reason, hint, ok := wire.Parse(err)
		switch {
		case ok:
			// A controller refused: prefer what it says over any transport
			// error, with etcd trouble the most telling.
			if refusal == nil || reason == wire.ReasonEtcdUnavailable {
				refusal = err
			}
			noLeader = noLeader || reason == wire.ReasonNoLeader
			if reason == wire.ReasonNotLeader && hint != "" && !relaysOnly {
				named[hint] = true
				if !tried[hint] && hops < maxHops {
					hops++
					queue = append([]string{hint}, queue...)
				}
			}
		case status.Code(err) == codes.Unavailable:
			unreachable, down[addr] = err, true
			c.forget(addr, cc)
		default:
			c.refused(addr, cc, err)
			return false, err
		}
	}
	if refusal != nil {
		if reason, _, _ := wire.Parse(refusal); reason == wire.ReasonEtcdUnavailable {
			return false, refusal
		}
		electing = noLeader
		for addr := range named {
			electing = electing || down[addr]
		}
		return electing, refusal
	}
	if unreachable != nil {
		return false, unreachable
	}
	if ctx.Err() == nil && skipped {
		return false, status.Error(codes.Unavailable, "no address to call: a relay carries agents' streams only")
	}
	return false, status.FromContextError(ctx.Err()).Err()
}

type relaysOnlyKey struct{}

// RelaysOnly makes calls under ctx go to the configured relays only, never
// to a controller directly: an agent that went around its failed relay
// uses it to come back through the relay, making its new stream there
// before it drops the direct one, and without registering with the
// controller a second time if no relay serves. Without relays, such a
// call fails with Unavailable.
func RelaysOnly(ctx context.Context) context.Context {
	return context.WithValue(ctx, relaysOnlyKey{}, true)
}

// untried counts the addresses in queue not tried yet.
func untried(queue []string, tried map[string]bool) int {
	n := 0
	seen := map[string]bool{}
	for _, a := range queue {
		if !tried[a] && !seen[a] {
			seen[a] = true
			n++
		}
	}
	return n
}

// relayConnectWait is how long an agent's stream waits for a relay to
// connect (dialFramed) before it goes on to the next address. An agent's stream has no deadline, and
// a relay cut off the network would otherwise hold it for the whole dial
// timeout on every attempt. It is short of the vouched timeout (a minute
// by default), so a relay's agents, still seen by their gossip peers, reach
// a controller before their nodes are declared lost; and long enough for a
// relay that a cold start keeps busy with a rack's handshakes.
const relayConnectWait = 10 * time.Second

// connected waits for cc to connect, for its share of the time left among
// attempts, so that a host gone from the network cannot use up the whole
// deadline. A refused connection counts as connected: the call then fails
// at once with the reason. A call on a connection gets all the time left:
// cutting short a controller that is working on a change would leave the
// caller unsure whether it happened.
func connected(ctx context.Context, cc *grpc.ClientConn, attempts int) bool {
	deadline, ok := ctx.Deadline()
	if !ok || attempts <= 1 {
		return true
	}
	wctx, cancel := context.WithTimeout(ctx, time.Until(deadline)/time.Duration(attempts))
	defer cancel()
	return settled(wctx, cc)
}

// settled waits until cc is connected or has failed to (a refused
// connection fails the call at once, with the reason), and says whether
// it got there before ctx ended.
func settled(ctx context.Context, cc *grpc.ClientConn) bool {
	cc.Connect()
	for {
		s := cc.GetState()
		if s == connectivity.Ready || s == connectivity.TransientFailure {
			return true
		}
		if !cc.WaitForStateChange(ctx, s) {
			return false
		}
	}
}

// stream is a streaming call that finds its controller on the first
// receive: until a response arrives, a refusal moves the call on. What is
// sent before then is held and sent again to each controller tried, so a
// bidirectional stream's opening message (the agent's register) reaches
// the one that serves it. Until the first RecvMsg returns, SendMsg and
// RecvMsg must not be called concurrently; after, the stream is gRPC's.
type stream struct {
	c      *Conn
	ctx    context.Context
	desc   *grpc.StreamDesc
	method string
	opts   []grpc.CallOption

	// sent and closed are what was sent, and whether CloseSend was
	// called, before the stream found its controller.
	sent   []any
	closed bool

	cs     grpc.ClientStream
	cancel context.CancelFunc
	// addr and cc are where the stream runs, once it does.
	addr string
	cc   *grpc.ClientConn
}

func (s *stream) SendMsg(m any) error {
	if s.cs != nil {
		return s.cs.SendMsg(m)
	}
	s.sent = append(s.sent, m)
	return nil
}

func (s *stream) CloseSend() error {
	if s.cs != nil {
		return s.cs.CloseSend()
	}
	s.closed = true
	return nil
}

func (s *stream) RecvMsg(m any) error {
	if s.cs != nil {
		err := s.cs.RecvMsg(m)
		if err != nil {
			s.cancel()
			s.c.refused(s.addr, s.cc, err)
		}
		return err
	}
	var first error
	// The stream lives on after the walk, so it hangs off the caller's
	// context rather than the attempt's.
	framed := s.method == rdzvv1.AgentService_Connect_FullMethodName
	err := s.c.each(s.ctx, framed, func(_ context.Context, addr string, cc *grpc.ClientConn) error {
		sctx, cancel := context.WithCancel(s.ctx)
		open := func(bool) (grpc.ClientStream, error) { return cc.NewStream(sctx, s.desc, s.method, s.opts...) }
		if cc == nil {
			open = func(fresh bool) (grpc.ClientStream, error) { return s.c.dialFramed(sctx, addr, fresh) }
		}
		cs, err := s.attempt(m, func() (grpc.ClientStream, error) { return open(false) })
		if stale(cs, err) {
			cs, err = s.attempt(m, func() (grpc.ClientStream, error) { return open(true) })
		}
		if err != nil && !errors.Is(err, io.EOF) {
			cancel()
			return err
		}
		s.cs, s.cancel, s.addr, s.cc, first = cs, cancel, addr, cc, err
		if err != nil {
			cancel()
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.sent = nil
	return first
}

// attempt opens a stream, sends it what was sent before the stream found
// its controller, and receives the first response into m.
func (s *stream) attempt(m any, open func() (grpc.ClientStream, error)) (grpc.ClientStream, error) {
	cs, err := open()
	if err == nil {
		err = s.replay(cs)
	}
	// A send fails with io.EOF when the controller has ended the stream (a
	// follower's refusal, say): the receive says why.
	if err == nil || errors.Is(err, io.EOF) {
		err = cs.RecvMsg(m)
	}
	return cs, err
}

// replay sends cs what was sent before the stream found its controller.
func (s *stream) replay(cs grpc.ClientStream) error {
	for _, m := range s.sent {
		if err := cs.SendMsg(m); err != nil {
			return err
		}
	}
	if s.closed {
		return cs.CloseSend()
	}
	return nil
}

func (s *stream) Header() (metadata.MD, error) {
	if s.cs == nil {
		return nil, nil
	}
	return s.cs.Header()
}

func (s *stream) Trailer() metadata.MD {
	if s.cs == nil {
		return nil
	}
	return s.cs.Trailer()
}

func (s *stream) Context() context.Context {
	if s.cs == nil {
		return s.ctx
	}
	return s.cs.Context()
}

// ParseAddrs splits a comma-separated list of controller host:port
// addresses, naming field in errors.
func ParseAddrs(field, list string) ([]string, error) {
	var addrs []string
	var errs []error
	for _, a := range strings.Split(list, ",") {
		a = strings.TrimSpace(a)
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("%s: %q is not host:port: %w", field, a, err))
			continue
		}
		addrs = append(addrs, a)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return addrs, nil
}
