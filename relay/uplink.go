package relay

import (
	"context"
	"crypto/x509"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// The relay carries all its agents' streams as frames of one Carry call to
// the leading controller (rdzv.v1.RelayService). The uplink keeps that
// call up: it opens one, serves it until it breaks (the controller
// restarted, failed over, or stepped down and named the new leader), and
// opens the next, one attempt per callRetry. While none is up, new agent
// streams wait for one (await): one attempt per relay knocks at a
// restarting controller, not one per agent, and the held agents register
// the moment it leads, through their relay. The relay's side of that call
// is its uplink; the controller's is its carrier (controller/carry.go).

// The relay passes its agents' messages on as they were encoded: an
// agent's ConnectRequest goes into its frame as the agent sent it, and a
// ConnectResponse reaches the agent as the controller encoded it. The
// controller decodes and checks every message anyway; decoding and
// encoding each again would cost the relay CPU and garbage for every
// assignment (a job's whole spec) of a rendezvous.

// agentBuffer bounds the frames waiting for one agent's stream; an agent
// that does not read them is dropped, so it cannot hold up its neighbours.
const agentBuffer = wire.AgentBacklog

// uplink is the relay's Carry call, over its lifetimes. Its one lock, mu,
// guards cur and up.
type uplink struct {
	r *Relay

	mu  sync.Mutex
	cur *call
	// up is closed when a call is up; a new one is made when it breaks.
	up chan struct{}
}

func newUplink(r *Relay) *uplink { return &uplink{r: r, up: make(chan struct{})} }

// run keeps a call up until ctx ends.
func (ca *uplink) run(ctx context.Context) {
	for ctx.Err() == nil {
		cl, err := ca.dial(ctx)
		if err != nil {
			ca.r.log.Debug("no controller serves the relay", zap.Error(err))
			select {
			case <-ctx.Done():
			case <-time.After(callRetry):
			}
			continue
		}
		ca.r.log.Info("carrying agents to the controller", zap.String("controller", ca.r.client.Leader()))
		ca.mu.Lock()
		ca.cur = cl
		close(ca.up)
		ca.mu.Unlock()
		ca.r.metrics.connected.Set(1)
		err = cl.serve()
		ca.r.metrics.connected.Set(0)
		ca.mu.Lock()
		ca.cur, ca.up = nil, make(chan struct{})
		ca.mu.Unlock()
		cl.endAll(status.Errorf(codes.Unavailable, "relay: its call to the controller ended: %v", status.Convert(err).Message()))
		if ctx.Err() == nil { // not the relay's own shutdown
			ca.r.log.Warn("controller call ended; agents reconnect", zap.Error(err))
		}
	}
}

// dial opens a call: the controller's first response says it serves it.
func (ca *uplink) dial(ctx context.Context) (*call, error) {
	cctx, cancel := context.WithCancelCause(ctx)
	stream, err := ca.r.client.Carry(cctx)
	if err == nil {
		_, err = stream.Recv()
	}
	if err != nil {
		cancel(err)
		return nil, err
	}
	return &call{stream: stream, ctx: cctx, end: cancel, streams: map[uint64]*agentStream{}, out: wire.NewFrameQueue[*rdzvv1.UpFrame]()}, nil
}

// await returns the call up now, waiting for one while a controller's host
// answers (reach), up to maxHold; an agent is sent around the relay when
// none does.
func (ca *uplink) await(ctx context.Context) (*call, error) {
	deadline := time.Now().Add(maxHold)
	for {
		ca.mu.Lock()
		cl, up := ca.cur, ca.up
		ca.mu.Unlock()
		if cl != nil {
			return cl, nil
		}
		if !ca.r.reach.reachable(ctx) {
			return nil, status.Error(codes.Unavailable, "relay: no controller reachable from the relay")
		}
		if time.Now().After(deadline) {
			return nil, status.Errorf(codes.Unavailable, "relay: no controller served in %s", maxHold)
		}
		select {
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		case <-up:
		case <-time.After(holdRetry):
		}
	}
}

// call is one Carry call and the agent streams on it.
type call struct {
	stream rdzvv1.RelayService_CarryClient
	ctx    context.Context
	end    context.CancelCauseFunc
	out    *wire.FrameQueue[*rdzvv1.UpFrame]

	mu      sync.Mutex
	next    uint64
	streams map[uint64]*agentStream
}

// agentStream is an agent's stream on a call: what the controller sends
// it, and why it ended.
type agentStream struct {
	id uint64
	// unsent holds a token for each of the agent's messages queued for the
	// controller and not sent yet: an agent that sends faster than the
	// call takes its messages waits once agentBuffer are queued (its own
	// reader, no neighbour's), rather than overflow the call's queue,
	// which would end the call and every agent's stream on it.
	unsent chan struct{}
	once   sync.Once
	gone   chan struct{}
	why    error

	// down queues what the controller sent the agent, up to agentBuffer
	// messages; wake is called when it may have grown, and when the
	// stream ends. A queue that grows as needed, rather than a channel of
	// agentBuffer slots, which would be a fixed 2 KiB per agent of the
	// relay's heap, scanned by every collection, to hold one message at a
	// time.
	mu   sync.Mutex
	down [][]byte
	wake func()
}

func newAgentStream(wake func()) *agentStream {
	return &agentStream{gone: make(chan struct{}), wake: wake, unsent: make(chan struct{}, agentBuffer)}
}

// push queues m for the agent; false when agentBuffer messages wait.
func (as *agentStream) push(m []byte) bool {
	as.mu.Lock()
	full := len(as.down) >= agentBuffer
	if !full {
		as.down = append(as.down, m)
	}
	as.mu.Unlock()
	if !full {
		as.wake()
	}
	return !full
}

// take empties the queue.
func (as *agentStream) take() [][]byte {
	as.mu.Lock()
	defer as.mu.Unlock()
	q := as.down
	as.down = nil
	return q
}

// stop ends the stream with why (the status its agent gets), once.
func (as *agentStream) stop(why error) {
	as.once.Do(func() {
		as.why = why
		close(as.gone)
		as.wake()
	})
}

// serve receives until the call breaks, with the sending beside, and
// returns why it broke.
func (cl *call) serve() error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		cl.end(cl.out.Run(cl.ctx, func(frames []*rdzvv1.UpFrame) error {
			if err := cl.stream.Send(&rdzvv1.CarryRequest{Frames: frames}); err != nil {
				return err
			}
			cl.sent(frames)
			return nil
		}))
	}()
	err := cl.receive()
	cl.end(err)
	<-done
	return err
}

func (cl *call) receive() error {
	for {
		resp, err := cl.stream.Recv()
		if err != nil {
			return err
		}
		for _, f := range resp.GetFrames() {
			cl.mu.Lock()
			as := cl.streams[f.GetStreamId()]
			end := f.GetEnd()
			if end != nil {
				delete(cl.streams, f.GetStreamId())
			}
			cl.mu.Unlock()
			switch {
			case as == nil:
				// Ended here first (the agent went); the controller's end
				// crossed the relay's close.
			case end != nil:
				as.stop(status.Error(codes.Code(end.GetCode()), end.GetMessage()))
			default:
				if !as.push(f.GetResponse()) {
					cl.close(as, status.Errorf(codes.ResourceExhausted, "relay: the agent fell %d messages behind", agentBuffer))
				}
			}
		}
	}
}

// open starts an agent's stream, as, on the call.
func (cl *call) open(as *agentStream, chain []*x509.Certificate, reg *rdzvv1.Register) error {
	ders := make([][]byte, len(chain))
	for i, c := range chain {
		ders[i] = c.Raw
	}
	cl.mu.Lock()
	if cl.ctx.Err() != nil {
		// Broken: endAll has ended, or is about to end, every stream it
		// holds; this one would never be.
		cl.mu.Unlock()
		return status.Errorf(codes.Unavailable, "relay: its call to the controller ended: %v", context.Cause(cl.ctx))
	}
	cl.next++
	as.id = cl.next
	cl.streams[as.id] = as
	cl.mu.Unlock()
	err := cl.put(&rdzvv1.UpFrame{StreamId: as.id, Frame: &rdzvv1.UpFrame_Open{Open: &rdzvv1.OpenStream{CertificateChain: ders, Register: reg}}})
	if err != nil {
		cl.mu.Lock()
		delete(cl.streams, as.id)
		cl.mu.Unlock()
		return err
	}
	return nil
}

// send passes an agent's message on, once fewer than agentBuffer of its
// messages wait to be sent.
func (cl *call) send(as *agentStream, m []byte) error {
	select {
	case as.unsent <- struct{}{}:
	case <-as.gone:
		return as.why
	case <-cl.ctx.Done():
		return status.Errorf(codes.Unavailable, "relay: its call to the controller ended: %v", context.Cause(cl.ctx))
	}
	err := cl.put(&rdzvv1.UpFrame{StreamId: as.id, Frame: &rdzvv1.UpFrame_Request{Request: m}})
	if err != nil {
		<-as.unsent
	}
	return err
}

// sent returns the tokens of the agents' messages in frames, sent.
func (cl *call) sent(frames []*rdzvv1.UpFrame) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	for _, f := range frames {
		if _, ok := f.GetFrame().(*rdzvv1.UpFrame_Request); !ok {
			continue
		}
		if as := cl.streams[f.GetStreamId()]; as != nil {
			select {
			case <-as.unsent:
			default:
			}
		}
	}
}

// close ends an agent's stream from the relay's side and tells the
// controller, unless the controller ended it first.
func (cl *call) close(as *agentStream, why error) {
	cl.mu.Lock()
	_, open := cl.streams[as.id]
	delete(cl.streams, as.id)
	cl.mu.Unlock()
	as.stop(why)
	if open {
		_ = cl.put(&rdzvv1.UpFrame{StreamId: as.id, Frame: &rdzvv1.UpFrame_Close{Close: &rdzvv1.CloseStream{}}})
	}
}

// put queues a frame; an overflowing queue breaks the call. A frame that
// would not fit the call's message limit alone (an agent's message near
// wire.MaxMessageBytes, with its stream's framing) is refused, with
// ResourceExhausted for its agent's stream only: sent, it would fail the
// call's send, which ends the call and every stream on it.
func (cl *call) put(f *rdzvv1.UpFrame) error {
	if n := wire.ItemBytes(proto.Size(f)); n > wire.MaxMessageBytes {
		return status.Errorf(codes.ResourceExhausted, "relay: the agent's message, framed for the relay's call to the controller, is %d bytes, over the call's limit of %d", n, wire.MaxMessageBytes)
	}
	if err := cl.out.Put(f); err != nil {
		cl.end(err)
		return status.Errorf(codes.Unavailable, "relay: its call to the controller ended: %v", err)
	}
	return nil
}

// endAll ends every agent stream of a call that broke.
func (cl *call) endAll(why error) {
	cl.mu.Lock()
	streams := cl.streams
	cl.streams = map[uint64]*agentStream{}
	cl.mu.Unlock()
	for _, as := range streams {
		as.stop(why)
	}
}

// errAgentGone ends the stream of an agent that went away.
var errAgentGone = errors.New("the agent closed its stream")
