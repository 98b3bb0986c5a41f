package controller

// RelayService.Carry: a relay's agents, many streams on one.

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// A relay carries each of its agents' streams as frames of one Carry call,
// so that the controller holds no gRPC stream, goroutine or TLS state per
// relayed agent, only its session: a cluster behind ten relays is ten
// streams, and a heartbeat is a frame in a batch, not a TLS record and a
// system call of its own.
//
// A carried stream behaves as a direct one would: the agent's certificate,
// forwarded by the relay, is verified and tracked here (trackRelayed), the
// agent may speak only as its node, each message is validated and handled
// as on a direct stream (agentMessage), and the stream ends with the status
// a direct stream would end with, which the relay passes on to the agent.

// errSessionEnded is how a stream the controller ended ends, when no more
// telling reason applies.
var errSessionEnded = status.Error(codes.Unavailable, "agent stream ended by the controller (shutting down, node declared lost, replaced by a newer connection of this node, or fell behind); reconnect")

type relayService struct {
	rdzvv1.UnimplementedRelayServiceServer
	c *Controller
}

// carrier is one relay's Carry call.
type carrier struct {
	c     *Controller
	relay pki.Identity
	ctx   context.Context
	// end ends the call with a cause: the lead ended (errLeadEnded; the
	// relay is told where the leader is, as by a follower), the relay fell
	// behind, a frame broke the protocol.
	end context.CancelCauseFunc
	log *zap.Logger

	out *wire.FrameQueue[*rdzvv1.DownFrame]

	mu      sync.Mutex
	streams map[uint64]*carried
}

// carried is one agent stream on a carrier.
type carried struct {
	id      uint64
	sess    *session
	tracked context.Context // the certificate's tracking (trackRelayed)
	untrack func()
	// invalid is why a frame of the agent's was refused; the stream ends
	// with it. Under the carrier's mu.
	invalid error
}

func (s *relayService) Carry(stream rdzvv1.RelayService_CarryServer) error {
	c := s.c
	if c.cfg.Insecure {
		return status.Error(codes.FailedPrecondition, "relays need mutual TLS: this controller runs insecure (insecure: true)")
	}
	relay, _ := identityFrom(stream.Context())
	ctx, end := context.WithCancelCause(stream.Context())
	defer end(nil)
	ca := &carrier{c: c, relay: relay, ctx: ctx, end: end, log: c.log.Named("relay").With(zap.Stringer("relay", relay)),
		streams: map[uint64]*carried{}, out: wire.NewFrameQueue[*rdzvv1.DownFrame]()}
	c.mu.Lock()
	if !c.gate.leading() {
		c.mu.Unlock()
		return c.gate.check()
	}
	c.carriers[ca] = struct{}{}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.carriers, ca)
		c.mu.Unlock()
	}()
	// The first response says this controller serves the call (the
	// relay's client settles on it).
	if err := stream.Send(&rdzvv1.CarryResponse{}); err != nil {
		return err
	}
	ca.log.Info("relay connected")

	// Receiving and handling run beside; sending here. Returning ends the
	// call, which ends the blocked receive, and every carried stream with
	// the call's context.
	//
	// Heartbeats are handled as they arrive; every other frame in order
	// behind the ones before it, by a goroutine of its own. An open
	// verifies a certificate and takes the lock, and behind a thousand of
	// them (a relay's agents registering at once), or behind the lock, a
	// thousand agents' heartbeats could go unread past their timeout: their
	// nodes would be declared lost, and register again through the same
	// queue. A heartbeat needs neither.
	ordered := wire.NewHandleQueue[upFrame]()
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				end(err)
				return
			}
			received := time.Now()
			for _, f := range req.GetFrames() {
				u := decodeFrame(f)
				if u.req.GetHeartbeat() != nil {
					_ = ca.handle(u) // a request ends its stream at worst, never the call
					continue
				}
				// Never waits: a receiver blocked behind a full backlog
				// would hold its heartbeats up unseen, and a relay's
				// agents would be declared lost.
				if err := ordered.Put(u); err != nil {
					end(err)
					return
				}
			}
			// The heartbeats behind this message waited while it was
			// handled: the controller's lag, not their silence (lag.go).
			// Real time, as there.
			c.lag.heldUp.note(time.Since(received))
		}
	}()
	go func() {
		_ = ordered.Run(ctx, func(frames []upFrame) error {
			for _, u := range frames {
				if ctx.Err() != nil {
					return ctx.Err() // the rest would open sessions on a call that ended
				}
				if err := ca.handle(u); err != nil {
					end(err)
					return err
				}
			}
			return nil
		})
	}()
	err := ca.out.Run(ctx, func(frames []*rdzvv1.DownFrame) error {
		return stream.Send(&rdzvv1.CarryResponse{Frames: frames})
	})
	end(err)
	err = ca.status()
	ca.log.Info("relay disconnected", zap.Error(err))
	return err
}

// status is what the call ends with, once its context has.
func (ca *carrier) status() error {
	if refused := streamRefused(ca.ctx); refused != nil {
		return refused // the relay's own certificate
	}
	cause := context.Cause(ca.ctx)
	if errors.Is(cause, errLeadEnded) {
		return ca.c.gate.check()
	}
	if _, ok := status.FromError(cause); ok {
		return cause
	}
	return status.Error(codes.Unavailable, "relay stream ended by the controller: "+cause.Error())
}

// enqueue queues a frame for the relay; false once the call has ended.
func (ca *carrier) enqueue(f *rdzvv1.DownFrame) bool {
	if err := ca.out.Put(f); err != nil {
		ca.end(err)
		return false
	}
	return true
}

// upFrame is a frame as received, with its agent's message decoded.
type upFrame struct {
	f *rdzvv1.UpFrame
	// req is the request frame's message; nil when it did not decode (bad
	// says why) and for the other frames.
	req *rdzvv1.ConnectRequest
	bad error
}

// decodeFrame decodes a request frame's message: the relay passed it on as
// its agent encoded it.
func decodeFrame(f *rdzvv1.UpFrame) upFrame {
	u := upFrame{f: f}
	if raw, ok := f.GetFrame().(*rdzvv1.UpFrame_Request); ok {
		req := &rdzvv1.ConnectRequest{}
		if err := proto.Unmarshal(raw.Request, req); err != nil {
			u.bad = status.Errorf(codes.InvalidArgument, "a message of the agent's does not decode as a ConnectRequest: %v", err)
		} else {
			u.req = req
		}
	}
	return u
}

// handle takes one frame; an error ends the whole call (the relay broke
// the protocol), while an agent's own fault ends its stream only.
func (ca *carrier) handle(u upFrame) error {
	id := u.f.GetStreamId()
	switch fr := u.f.GetFrame().(type) {
	case *rdzvv1.UpFrame_Open:
		return ca.open(id, fr.Open)
	case *rdzvv1.UpFrame_Request:
		cs := ca.get(id)
		if cs == nil {
			return nil // ended here while the relay sent it
		}
		err := u.bad
		if err == nil {
			err = validateRequest(u.req)
		}
		if err != nil {
			ca.mu.Lock()
			cs.invalid = err
			ca.mu.Unlock()
			cs.sess.cancel()
			return nil
		}
		ca.c.agentMessage(cs.sess, u.req)
	case *rdzvv1.UpFrame_Close:
		if cs := ca.get(id); cs != nil {
			cs.sess.cancel()
		}
	default:
		return status.Errorf(codes.InvalidArgument, "frame of stream %d: no open, request or close", id)
	}
	return nil
}

func (ca *carrier) get(id uint64) *carried {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	return ca.streams[id]
}

// open starts a carried stream: what a direct stream's handshake and
// registration do.
func (ca *carrier) open(id uint64, o *rdzvv1.OpenStream) error {
	c := ca.c
	ca.mu.Lock()
	_, dup := ca.streams[id]
	ca.mu.Unlock()
	if dup {
		return status.Errorf(codes.InvalidArgument, "stream %d opened twice", id)
	}
	if err := c.gate.check(); err != nil {
		// Not leading any more: the relay is sent to the leader, with all
		// its agents.
		return err
	}
	reg := o.GetRegister()
	if err := validateRequest(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Register{Register: reg}}); err != nil {
		ca.refuse(id, err)
		return nil
	}
	name := reg.GetNode().GetName()
	r, err := c.guard.auth.relayedAgent(ca.relay, o.GetCertificateChain())
	if err == nil {
		err = nodeIdentity(r.verification.ID, name)
	}
	if err != nil {
		ca.log.Warn("relayed agent refused", zap.String("node", name), zap.Error(err))
		ca.refuse(id, err)
		return nil
	}
	tracked, untrack, err := trackRelayed(ca.ctx, r)
	if err != nil {
		ca.refuse(id, err)
		return nil
	}
	// The tracking context is the stream's alone: the session ends with
	// it, and ending the session ends the tracking (untrack, which ended
	// runs again).
	sess := sessionOn(tracked, untrack, name, carriedSender{ca: ca, id: id}, c.clock.Now)
	sess.certNotAfter, sess.relayed = r.leaf.notAfter, true
	cs := &carried{id: id, sess: sess, tracked: tracked, untrack: untrack}
	ca.mu.Lock()
	ca.streams[id] = cs
	ca.mu.Unlock()
	c.register(sess, reg)
	context.AfterFunc(sess.ctx, func() { ca.ended(cs) })
	return nil
}

// refuse tells the relay that stream id ended, and why: refused at its
// open, or ended since (ended).
func (ca *carrier) refuse(id uint64, err error) {
	st := status.Convert(err)
	ca.enqueue(&rdzvv1.DownFrame{StreamId: id, Frame: &rdzvv1.DownFrame_End{End: &rdzvv1.StreamEnd{Code: uint32(st.Code()), Message: st.Message()}}})
}

// ended cleans up after a carried stream whose session ended, and tells
// the relay why, unless the whole call ended.
func (ca *carrier) ended(cs *carried) {
	cs.sess.close()
	ca.mu.Lock()
	delete(ca.streams, cs.id)
	invalid := cs.invalid
	ca.mu.Unlock()
	err := errSessionEnded
	if refused := streamRefused(cs.tracked); refused != nil {
		err = refused
	} else if invalid != nil {
		err = invalid
		ca.log.Warn("ending relayed agent stream: invalid message", zap.String("node", cs.sess.node), zap.Error(err))
	}
	if ca.ctx.Err() == nil {
		ca.refuse(cs.id, err)
	}
	cs.untrack()
	ca.c.disconnect(cs.sess)
}

// carriedSender is a carried stream's sending half: a frame queued for the
// relay.
type carriedSender struct {
	ca *carrier
	id uint64
}

// Send encodes m here, on the session's sending goroutine, as gRPC would
// for a direct stream: the relay passes the bytes on as they are, and the
// carrier's one sending goroutine only copies them into its batch.
func (s carriedSender) Send(m *rdzvv1.ConnectResponse) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return status.Errorf(codes.Internal, "encoding a message for the agent: %v", err)
	}
	if !s.ca.enqueue(&rdzvv1.DownFrame{StreamId: s.id, Frame: &rdzvv1.DownFrame_Response{Response: b}}) {
		return context.Cause(s.ca.ctx)
	}
	return nil
}
