package wire

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// MaxConnectionIdle is how long a server keeps a client connection that
// carries no call: longer than an agent's reconnect backoff (10 s at most),
// far shorter than an idle connection left behind by an agent that moved
// would otherwise stay. A client that calls again later dials again,
// resuming its TLS session.
const MaxConnectionIdle = 30 * time.Second

// StreamServerOptions are the gRPC server options of whatever serves agent
// streams, the controller and the relay, so that an agent meets the same
// limits and keepalive either way.
func StreamServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxMessageBytes),
		grpc.MaxSendMsgSize(MaxMessageBytes),
		// Agents ping every 10 s, streams or not (agent.Keepalive).
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		// A connection without a stream for MaxConnectionIdle is closed
		// (a GOAWAY; the client dials again when it next calls). An agent
		// that went around its relay and came back through it kept its
		// direct connection open, idle, with gRPC's three goroutines and
		// buffers at the controller, one for each agent that went around
		// its relay during a cold start.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, MaxConnectionIdle: MaxConnectionIdle}),
		// Each agent holds a connection for weeks and sends a heartbeat a
		// second: gRPC's default 32 KiB read and write buffers per
		// connection would be most of the controller's memory per node. The
		// write buffer is taken from a pool for each flush instead, and
		// frames are read through TLS's own record buffer. The pool keeps
		// what a burst (an assignment per node) took until two GCs have
		// passed: 8 KiB buffers, a quarter of the default, hold most
		// messages whole (a larger one is flushed in parts) and keep the
		// pool small.
		grpc.SharedWriteBuffer(true),
		grpc.WriteBufferSize(8 << 10),
		grpc.ReadBufferSize(0),
		grpc.InitialWindowSize(FlowWindow),
		grpc.InitialConnWindowSize(FlowWindow),
	}
}
