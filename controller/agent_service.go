package controller

import (
	"fmt"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// registerTimeout bounds how long a new stream may take to say who it is.
const registerTimeout = 10 * time.Second

type agentService struct {
	rdzvv1.UnimplementedAgentServiceServer
	c *Controller
}

func (a *agentService) Connect(stream rdzvv1.AgentService_ConnectServer) error {
	c := a.c
	reg, err := wire.RecvRegister(stream.Recv, registerTimeout)
	if err != nil {
		c.log.Named("agent").Warn("refusing agent stream", zap.Error(err))
		return err
	}
	name := reg.GetNode().GetName()
	if err := c.guard.checkNodeIdentity(stream.Context(), name); err != nil {
		c.log.Named("agent").Warn("registration refused", zap.String("node", name), zap.Error(err))
		return err
	}
	sess := newSession(stream.Context(), name, stream, c.clock.Now)
	sess.certNotAfter = clientCertNotAfter(stream.Context())
	defer sess.cancel()
	log := c.log.Named("agent").With(zap.String("node", name))
	c.register(sess, reg)
	defer c.disconnect(sess)

	// Receiving runs beside this handler, and sending wherever a message is
	// queued (session.send). The handler returns as soon as the session
	// ends from either side; returning is what makes gRPC tear the stream
	// down, which ends the blocked Recv.
	// invalid carries the reason a message was refused (streamGuard): the
	// stream ends with it, so the agent sees what it did wrong.
	invalid := make(chan error, 1)
	go func() {
		defer sess.cancel()
		for {
			m, err := stream.Recv()
			if status.Code(err) == codes.InvalidArgument {
				invalid <- err
				return
			}
			if err != nil {
				return // the agent went away; it reconnects and re-registers
			}
			c.agentMessage(sess, m)
		}
	}()
	<-sess.ctx.Done()
	sess.close()
	select {
	case err := <-invalid:
		log.Warn("ending agent stream: invalid message", zap.Error(err))
		return err
	default:
	}
	if err := sess.failed(); err != nil {
		return fmt.Errorf("sending to agent %s: %w", name, err)
	}
	if stream.Context().Err() != nil {
		return nil
	}
	return errSessionEnded
}

// agentMessage handles one message of an agent's stream, direct or
// carried by a relay, after the register that opened it.
func (c *Controller) agentMessage(sess *session, m *rdzvv1.ConnectRequest) {
	name := sess.node
	now, handling := c.clock.Now(), time.Now()
	sess.touch(now)
	switch msg := m.GetMsg().(type) {
	case *rdzvv1.ConnectRequest_Heartbeat:
		sess.heartbeated.Store(true)
		sess.noteStandby(msg.Heartbeat.GetStandbyReady())
		c.metrics.heartbeat(sess.heartbeat(now, c.cfg.Heartbeat.Interval.Duration))
		sess.sendNow(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_HeartbeatAck{HeartbeatAck: &rdzvv1.HeartbeatAck{Seq: msg.Heartbeat.GetSeq()}}})
	case *rdzvv1.ConnectRequest_GpuFault:
		c.gpuFault(name, msg.GpuFault)
	case *rdzvv1.ConnectRequest_Health:
		c.nodeHealth(name, sess, msg.Health.GetResults())
	case *rdzvv1.ConnectRequest_GossipView:
		c.gossipView(name, msg.GossipView)
	case *rdzvv1.ConnectRequest_WorkerStatus:
		c.workerStatus(name, msg.WorkerStatus)
	case *rdzvv1.ConnectRequest_Progress:
		c.progress(name, msg.Progress)
	case *rdzvv1.ConnectRequest_Checkpoint:
		c.checkpoint(name, msg.Checkpoint)
	case *rdzvv1.ConnectRequest_PortProbeResult:
		sess.deliver(msg.PortProbeResult.GetRequestId(), m)
	case *rdzvv1.ConnectRequest_LogChunk:
		sess.deliver(msg.LogChunk.GetRequestId(), m)
	case *rdzvv1.ConnectRequest_Restarting:
		c.agentRestarting(name, sess, msg.Restarting)
	case *rdzvv1.ConnectRequest_Register:
		c.log.Named("agent").Warn("ignoring repeated register on an open stream", zap.String("node", name))
	}
	// This stream's next heartbeat waited while this message was
	// handled: behind the lock, when thousands of worker reports
	// queue for it at once. Real time, like the runtime's own
	// account of waits (lag.go): it measures this host's work.
	c.lag.heldUp.note(time.Since(handling))
}
