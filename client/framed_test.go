package client_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/client"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// framedRelay serves agent connections in frames (wire.AgentProtocol) on
// loopback, the i-th accepted with serve[i], one after the other.
func framedRelay(t *testing.T, conf *tls.Config, serve ...func(c *tls.Conn)) string {
	t.Helper()
	conf = conf.Clone()
	conf.NextProtos = []string{wire.AgentProtocol}
	l, err := tls.Listen("tcp", "127.0.0.1:0", conf)
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, serve := range serve {
			c, err := l.Accept()
			if err != nil {
				return
			}
			serve(c.(*tls.Conn))
			_ = c.Close()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done
	})
	return l.Addr().String()
}

// relayTLS is a relay's server TLS configuration on loopback, and the
// files of agent node-a, of one CA.
func relayTLS(t *testing.T) (*tls.Config, pki.Files) {
	t.Helper()
	ca := newTestCA(t)
	relayCert := ca.issue(t, pki.Identity{Role: pki.RoleRelay, Name: "rack-1"}, net.IPv4(127, 0, 0, 1))
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{{Certificate: [][]byte{relayCert.Cert.Raw}, PrivateKey: relayCert.Key, Leaf: relayCert.Cert}},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    ca.pool(),
	}, ca.files(t, ca.issue(t, pki.Identity{Role: pki.RoleAgent, Name: "node-a"}))
}

// readMessage reads the next message frame into m, answering pings if
// pong.
func readMessage(c *tls.Conn, m proto.Message, pong bool) error {
	for {
		kind, p, err := wire.ReadFrame(c)
		if err != nil {
			return err
		}
		switch kind {
		case wire.FrameMessage:
			return proto.Unmarshal(p, m)
		case wire.FramePing:
			if pong {
				if _, err := c.Write(wire.AppendFrame(nil, wire.FramePong, nil)); err != nil {
					return err
				}
			}
		default:
			return errors.New("unexpected frame")
		}
	}
}

func writeMessage(c *tls.Conn, m proto.Message) error {
	b, err := wire.AppendMessage(nil, m)
	if err == nil {
		_, err = c.Write(b)
	}
	return err
}

var (
	registered = &rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_Registered{Registered: &rdzvv1.Registered{HeartbeatIntervalMs: 1000}}}
	heartbeat  = &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Heartbeat{Heartbeat: &rdzvv1.Heartbeat{Seq: 1}}}
	ack        = &rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_HeartbeatAck{HeartbeatAck: &rdzvv1.HeartbeatAck{Seq: 1}}}
)

// An agent's stream to a relay goes in frames over a connection of its
// own, as a gRPC stream would to the controller, its end included. A relay that falls
// silent is given up by the keepalive; one that answers its pings is kept.
func TestRelayStreamTransports(t *testing.T) {
	srvConf, agentFiles := relayTLS(t)
	client.ShortKeepalive(t, 100*time.Millisecond, 200*time.Millisecond)

	tests := []struct {
		name  string
		relay func(t *testing.T) string
		// after the heartbeat's acknowledgement, the stream ends with
		// this: a status, or io.EOF.
		code    codes.Code
		wantErr string
	}{
		{
			name: "frames",
			relay: func(t *testing.T) string {
				return framedRelay(t, srvConf, func(c *tls.Conn) {
					var m rdzvv1.ConnectRequest
					if readMessage(c, &m, true) != nil || m.GetRegister().GetNode().GetName() != "node-a" || writeMessage(c, registered) != nil {
						return
					}
					if readMessage(c, &m, true) != nil || m.GetHeartbeat() == nil || writeMessage(c, ack) != nil {
						return
					}
					_, _ = c.Write(wire.AppendEnd(nil, status.Error(codes.PermissionDenied, "go away")))
				})
			},
			code: codes.PermissionDenied, wantErr: "go away",
		},
		{
			name: "frames: pings answered",
			relay: func(t *testing.T) string {
				return framedRelay(t, srvConf, func(c *tls.Conn) {
					var m rdzvv1.ConnectRequest
					if readMessage(c, &m, true) != nil || writeMessage(c, registered) != nil {
						return
					}
					if readMessage(c, &m, true) != nil || m.GetHeartbeat() == nil {
						return
					}
					// The acknowledgement waits for three pings, each
					// answered: the pongs keep the stream.
					for range 3 {
						kind, _, err := wire.ReadFrame(c)
						if err != nil || kind != wire.FramePing {
							return
						}
						if _, err := c.Write(wire.AppendFrame(nil, wire.FramePong, nil)); err != nil {
							return
						}
					}
					if writeMessage(c, ack) != nil {
						return
					}
					_, _ = c.Write(wire.AppendEnd(nil, nil))
				})
			},
			code: codes.OK,
		},
		{
			name: "frames: a silent relay",
			relay: func(t *testing.T) string {
				return framedRelay(t, srvConf, func(c *tls.Conn) {
					var m rdzvv1.ConnectRequest
					if readMessage(c, &m, true) != nil || writeMessage(c, registered) != nil {
						return
					}
					if readMessage(c, &m, true) != nil || writeMessage(c, ack) != nil {
						return
					}
					// Silent from now on: pings go unanswered.
					for readMessage(c, &m, false) == nil {
					}
				})
			},
			code: codes.Unavailable, wantErr: "silent for 300ms",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			relay := tt.relay(t)
			// The controller is never reached: a port nothing listens on.
			cfg := client.DefaultConfig()
			cfg.Endpoints, cfg.Relays, cfg.TLS, cfg.Logger = []string{closedPort(t)}, []string{relay}, &client.TLS{Files: agentFiles}, zaptest.NewLogger(t)
			c, err := client.New(cfg)
			require.NoError(t, err)
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			stream, err := c.Connect(ctx)
			require.NoError(t, err)
			require.NoError(t, stream.Send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Register{Register: &rdzvv1.Register{Node: &rdzvv1.NodeInfo{Name: "node-a"}}}}))
			m, err := stream.Recv()
			require.NoError(t, err)
			require.NotNil(t, m.GetRegistered(), "%v", m)
			require.Equal(t, relay, c.Leader())
			require.True(t, c.Relayed())
			require.NoError(t, stream.Send(heartbeat))
			m, err = stream.Recv()
			require.NoError(t, err)
			require.NotNil(t, m.GetHeartbeatAck(), "%v", m)
			_, err = stream.Recv()
			if tt.code == codes.OK {
				require.ErrorIs(t, err, io.EOF)
				return
			}
			require.Equal(t, tt.code, status.Code(err), "%v", err)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

// A stream that its relay ended as Unavailable (its call to the
// controller ended) leaves its connection for the agent's next stream
// there; a connection the relay closed meanwhile is replaced by a new one,
// without going around the relay.
// A relay's address that serves gRPC only (a controller's port, given as a
// relay by mistake) fails the TLS handshake, as no protocol is common: the
// agent's stream goes on to the next address.
func TestRelayThatSpeaksGRPCOnly(t *testing.T) {
	srvConf, agentFiles := relayTLS(t)
	relay, _ := serve(t, func(s *grpc.Server) {
		rdzvv1.RegisterAgentServiceServer(s, &agentServer{registers: make(chan string, 1)})
	}, grpc.Creds(credentials.NewTLS(srvConf)))
	cfg := client.DefaultConfig()
	cfg.Endpoints, cfg.Relays, cfg.TLS, cfg.Logger = []string{closedPort(t)}, []string{relay}, &client.TLS{Files: agentFiles}, zaptest.NewLogger(t)
	c, err := client.New(cfg)
	require.NoError(t, err)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := c.Connect(client.RelaysOnly(ctx))
	require.NoError(t, err)
	require.NoError(t, stream.Send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Register{Register: &rdzvv1.Register{Node: &rdzvv1.NodeInfo{Name: "node-a"}}}}))
	_, err = stream.Recv()
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "tls handshake with relay")
	require.Empty(t, client.Dialled(c), "no gRPC connection to the relay's address")
}

func TestRelayConnectionKept(t *testing.T) {
	srvConf, agentFiles := relayTLS(t)
	unavailable := status.Error(codes.Unavailable, "relay: its call to the controller ended")
	// register serves one stream: a register, then the end.
	register := func(c *tls.Conn, end error) bool {
		var m rdzvv1.ConnectRequest
		if readMessage(c, &m, true) != nil || m.GetRegister() == nil || writeMessage(c, registered) != nil {
			return false
		}
		_, err := c.Write(wire.AppendEnd(nil, end))
		return err == nil
	}
	relay := framedRelay(t, srvConf,
		// Two streams on the first connection, the relay closes it after
		// the second's end, and the third stream gets a connection of its
		// own.
		func(c *tls.Conn) { _ = register(c, unavailable) && register(c, unavailable) },
		func(c *tls.Conn) { _ = register(c, status.Error(codes.PermissionDenied, "the last")) },
	)
	cfg := client.DefaultConfig()
	cfg.Endpoints, cfg.Relays, cfg.TLS, cfg.Logger = []string{closedPort(t)}, []string{relay}, &client.TLS{Files: agentFiles}, zaptest.NewLogger(t)
	c, err := client.New(cfg)
	require.NoError(t, err)
	defer c.Close()
	for i, want := range []codes.Code{codes.Unavailable, codes.Unavailable, codes.PermissionDenied} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		stream, err := c.Connect(ctx)
		require.NoError(t, err)
		require.NoError(t, stream.Send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Register{Register: &rdzvv1.Register{Node: &rdzvv1.NodeInfo{Name: "node-a"}}}}))
		m, err := stream.Recv()
		require.NoError(t, err, "stream %d", i)
		require.NotNil(t, m.GetRegistered(), "stream %d: %v", i, m)
		require.Equal(t, relay, c.Leader(), "stream %d went through the relay", i)
		_, err = stream.Recv()
		require.Equal(t, want, status.Code(err), "stream %d: %v", i, err)
		cancel()
	}
}
