package client_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/rdzv/rdzv/client"
	"github.com/rdzv/rdzv/internal/testaddr"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// electing answers ListJobs as a controller does while an election is
// under way, for its first refusals calls, then serves: no one leads, or,
// with staleLeader, a follower still names the leader that died.
type electing struct {
	rdzvv1.UnimplementedJobServiceServer
	refusals    int64
	staleLeader string
	calls       atomic.Int64
}

func (e *electing) ListJobs(context.Context, *rdzvv1.ListJobsRequest) (*rdzvv1.ListJobsResponse, error) {
	if e.calls.Add(1) <= e.refusals {
		if e.staleLeader != "" {
			return nil, wire.Error(wire.ReasonNotLeader, e.staleLeader, "a follower; the leader is "+e.staleLeader)
		}
		return nil, wire.Error(wire.ReasonNoLeader, "", "no controller leads yet; retry")
	}
	return &rdzvv1.ListJobsResponse{Jobs: []*rdzvv1.Job{{}}}, nil
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	accepted atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// serve starts a gRPC server on loopback with what register adds and
// returns its address and listener.
func serve(t *testing.T, register func(*grpc.Server), opts ...grpc.ServerOption) (string, *countingListener) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cl := &countingListener{Listener: l}
	s := grpc.NewServer(opts...)
	register(s)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(cl)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-done
	})
	return l.Addr().String(), cl
}

func serveJobs(t *testing.T, srv rdzvv1.JobServiceServer) string {
	addr, _ := serve(t, func(s *grpc.Server) { rdzvv1.RegisterJobServiceServer(s, srv) })
	return addr
}

// insecureClient is a client of endpoints without TLS.
func insecureClient(t *testing.T, endpoints ...string) *client.Client {
	t.Helper()
	cfg := client.DefaultConfig()
	cfg.Endpoints, cfg.Insecure, cfg.Logger = endpoints, true, zaptest.NewLogger(t)
	c, err := client.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// A call made while no controller leads waits for the election, within
// its deadline; without one, or past it, the caller gets the refusal.
func TestCallsWaitOutAnElection(t *testing.T) {
	tests := []struct {
		name     string
		refusals int64
		// leaderDied: the follower names a leader that no longer answers.
		leaderDied bool
		deadline   time.Duration
		wantErr    bool
		// minCalls, maxCalls bound how often the call was made.
		minCalls, maxCalls int64
	}{
		{name: "election ends in time", refusals: 3, deadline: 10 * time.Second, minCalls: 4, maxCalls: 4},
		{name: "the named leader died", refusals: 3, leaderDied: true, deadline: 10 * time.Second, minCalls: 4, maxCalls: 4},
		{name: "no deadline: no wait", refusals: 3, wantErr: true, minCalls: 1, maxCalls: 1},
		{name: "election outlasts the deadline", refusals: 1 << 30, deadline: time.Second, wantErr: true, minCalls: 2, maxCalls: 1 << 30},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := &electing{refusals: tt.refusals}
			addrs := []string{serveJobs(t, srv)}
			if tt.leaderDied {
				srv.staleLeader = testaddr.Free(t)
				addrs = append([]string{srv.staleLeader}, addrs...)
			}
			c := insecureClient(t, addrs...)
			ctx := context.Background()
			if tt.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.deadline)
				defer cancel()
			}
			resp, err := c.ListJobs(ctx, &rdzvv1.ListJobsRequest{})
			if tt.wantErr {
				reason, _, ok := wire.Parse(err)
				require.True(t, ok, "not the controller's refusal: %v", err)
				require.Equal(t, wire.ReasonNoLeader, reason)
			} else {
				require.NoError(t, err)
				require.Len(t, resp.GetJobs(), 1)
			}
			require.GreaterOrEqual(t, srv.calls.Load(), tt.minCalls)
			require.LessOrEqual(t, srv.calls.Load(), tt.maxCalls)
		})
	}
}

// agentServer answers Connect as a controller: a follower refuses it,
// naming the leader, before reading anything; the leader reads the
// register, confirms it, then acknowledges one heartbeat and ends.
type agentServer struct {
	rdzvv1.UnimplementedAgentServiceServer
	// leader is set on a follower: where it sends agents.
	leader    string
	calls     atomic.Int64
	registers chan string
}

func (a *agentServer) Connect(stream grpc.BidiStreamingServer[rdzvv1.ConnectRequest, rdzvv1.ConnectResponse]) error {
	a.calls.Add(1)
	if a.leader != "" {
		return wire.Error(wire.ReasonNotLeader, a.leader, "a follower")
	}
	m, err := stream.Recv()
	if err != nil {
		return err
	}
	a.registers <- m.GetRegister().GetNode().GetName()
	if err := stream.Send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_Registered{Registered: &rdzvv1.Registered{HeartbeatIntervalMs: 1000}}}); err != nil {
		return err
	}
	if m, err = stream.Recv(); err != nil {
		return err
	}
	if m.GetHeartbeat() == nil {
		return status.Errorf(codes.InvalidArgument, "want a heartbeat, got %v", m)
	}
	return stream.Send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_HeartbeatAck{HeartbeatAck: &rdzvv1.HeartbeatAck{}}})
}

// A bidirectional stream opened on a follower goes to the leader it names,
// its opening message with it, and then runs there both ways.
func TestStreamFollowsTheLeader(t *testing.T) {
	leader := &agentServer{registers: make(chan string, 1)}
	leaderAddr, _ := serve(t, func(s *grpc.Server) { rdzvv1.RegisterAgentServiceServer(s, leader) })
	follower := &agentServer{leader: leaderAddr}
	followerAddr, _ := serve(t, func(s *grpc.Server) { rdzvv1.RegisterAgentServiceServer(s, follower) })
	c := insecureClient(t, followerAddr, leaderAddr)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := c.Connect(ctx)
	require.NoError(t, err)
	reg := &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Register{Register: &rdzvv1.Register{Node: &rdzvv1.NodeInfo{Name: "node-a"}}}}
	require.NoError(t, stream.Send(reg))
	first, err := stream.Recv()
	require.NoError(t, err)
	require.EqualValues(t, 1000, first.GetRegistered().GetHeartbeatIntervalMs())
	require.Equal(t, "node-a", <-leader.registers, "the register sent before the first receive reaches the leader")
	require.Equal(t, leaderAddr, c.Leader())
	require.EqualValues(t, 1, follower.calls.Load())

	require.NoError(t, stream.Send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Heartbeat{Heartbeat: &rdzvv1.Heartbeat{Seq: 1}}}))
	ack, err := stream.Recv()
	require.NoError(t, err)
	require.NotNil(t, ack.GetHeartbeatAck())
	_, err = stream.Recv()
	require.ErrorIs(t, err, io.EOF)
	require.EqualValues(t, 1, leader.calls.Load())
}

// refusing answers its first call with code and serves the ones after, as
// a controller refuses a certificate (Unauthenticated) until it is
// renewed; StreamLogs sends one chunk before the refusal, as a stream
// ended when the certificate expires.
type refusing struct {
	rdzvv1.UnimplementedJobServiceServer
	code  codes.Code
	calls atomic.Int64
}

func (r *refusing) ListJobs(context.Context, *rdzvv1.ListJobsRequest) (*rdzvv1.ListJobsResponse, error) {
	if r.calls.Add(1) == 1 {
		return nil, status.Error(r.code, "refused")
	}
	return &rdzvv1.ListJobsResponse{}, nil
}

func (r *refusing) StreamLogs(_ *rdzvv1.StreamLogsRequest, stream grpc.ServerStreamingServer[rdzvv1.StreamLogsResponse]) error {
	if err := stream.Send(&rdzvv1.StreamLogsResponse{}); err != nil {
		return err
	}
	if r.calls.Add(1) == 1 {
		return status.Error(r.code, "refused")
	}
	return nil
}

// A connection whose certificate a controller refused is dropped, so the
// next call handshakes anew (with the renewed certificate); any other
// refusal keeps it.
func TestRefusedCertificateDropsTheConnection(t *testing.T) {
	tests := []struct {
		name   string
		code   codes.Code
		stream bool
		// wantConns is how many connections the two calls took.
		wantConns int64
	}{
		{name: "unauthenticated call", code: codes.Unauthenticated, wantConns: 2},
		{name: "unauthenticated mid-stream", code: codes.Unauthenticated, stream: true, wantConns: 2},
		{name: "permission denied", code: codes.PermissionDenied, wantConns: 1},
		{name: "not found mid-stream", code: codes.NotFound, stream: true, wantConns: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := &refusing{code: tt.code}
			addr, l := serve(t, func(s *grpc.Server) { rdzvv1.RegisterJobServiceServer(s, srv) })
			c := insecureClient(t, addr)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			call := func() error {
				if !tt.stream {
					_, err := c.ListJobs(ctx, &rdzvv1.ListJobsRequest{})
					return err
				}
				stream, err := c.StreamLogs(ctx, &rdzvv1.StreamLogsRequest{Job: "train"})
				require.NoError(t, err)
				for {
					if _, err := stream.Recv(); err != nil {
						if errors.Is(err, io.EOF) {
							return nil
						}
						return err
					}
				}
			}
			require.Equal(t, tt.code, status.Code(call()))
			require.NoError(t, call())
			require.Equal(t, tt.wantConns, l.accepted.Load())
		})
	}
}

// An agent's stream goes through its relay while the relay answers, to the
// controller when it does not, and through the relay again at the next
// stream once it is back, though the controller served last.
func TestRelaysGoFirst(t *testing.T) {
	ca := newTestCA(t)
	loopback := net.IPv4(127, 0, 0, 1)
	serverConf := func(id pki.Identity) *tls.Config {
		is := ca.issue(t, id, loopback)
		return &tls.Config{
			MinVersion:   tls.VersionTLS13,
			Certificates: []tls.Certificate{{Certificate: [][]byte{is.Cert.Raw}, PrivateKey: is.Key, Leaf: is.Cert}},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			ClientCAs:    ca.pool(),
		}
	}
	// Room for every stream that goes around the relay while it is away.
	ctl := &agentServer{registers: make(chan string, 512)}
	ctlAddr, _ := serve(t, func(s *grpc.Server) { rdzvv1.RegisterAgentServiceServer(s, ctl) },
		grpc.Creds(credentials.NewTLS(serverConf(pki.Identity{Role: pki.RoleController, Name: "controller"}))))
	relayConf := serverConf(pki.Identity{Role: pki.RoleRelay, Name: "rack-1"})
	relayConf.NextProtos = []string{wire.AgentProtocol}
	relayRegisters := make(chan string, 4)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	relayAddr := l.Addr().String()
	// serveRelay registers each stream in frames, and holds it until the
	// agent or stop closes it.
	serveRelay := func(l net.Listener) (stop func()) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var conns []net.Conn
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
				wg.Add(1)
				go func() {
					defer wg.Done()
					tc := tls.Server(c, relayConf)
					var m rdzvv1.ConnectRequest
					if readMessage(tc, &m, true) != nil {
						return
					}
					relayRegisters <- m.GetRegister().GetNode().GetName()
					if writeMessage(tc, registered) != nil {
						return
					}
					for readMessage(tc, &m, true) == nil {
					}
				}()
			}
		}()
		return func() {
			_ = l.Close()
			mu.Lock()
			for _, c := range conns {
				_ = c.Close()
			}
			mu.Unlock()
			wg.Wait()
		}
	}
	stopRelay := serveRelay(l)
	cfg := client.DefaultConfig()
	cfg.Endpoints, cfg.Relays, cfg.Logger = []string{ctlAddr}, []string{relayAddr}, zaptest.NewLogger(t)
	cfg.TLS = &client.TLS{Files: ca.files(t, ca.issue(t, pki.Identity{Role: pki.RoleAgent, Name: "node-a"}))}
	c, err := client.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })

	registerUnder := func(ctx context.Context) error {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		stream, err := c.Connect(ctx)
		require.NoError(t, err)
		require.NoError(t, stream.Send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Register{Register: &rdzvv1.Register{Node: &rdzvv1.NodeInfo{Name: "node-a"}}}}))
		_, err = stream.Recv()
		return err
	}
	register := func() {
		t.Helper()
		require.NoError(t, registerUnder(context.Background()))
	}
	register()
	require.Equal(t, relayAddr, c.Leader())
	require.True(t, c.Relayed())
	require.Equal(t, "node-a", <-relayRegisters)

	stopRelay()
	register()
	require.Equal(t, ctlAddr, c.Leader(), "around the relay that is gone")
	require.False(t, c.Relayed())
	require.Equal(t, "node-a", <-ctl.registers)

	// Relays only: with the relay away the call fails, and the controller
	// never hears of it.
	err = registerUnder(client.RelaysOnly(context.Background()))
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.Empty(t, ctl.registers)
	require.Equal(t, ctlAddr, c.Leader())

	l, err = net.Listen("tcp", relayAddr)
	require.NoError(t, err)
	t.Cleanup(serveRelay(l))
	require.NoError(t, registerUnder(client.RelaysOnly(context.Background())), "back through the relay")
	require.Equal(t, relayAddr, c.Leader())
	require.True(t, c.Relayed())
	require.Equal(t, "node-a", <-relayRegisters)
	require.Empty(t, ctl.registers, "relays only: never around the relay")
}

// TestRelaysOnlyWithoutRelays: a client without relays fails a call
// under RelaysOnly rather than make it to a controller.
func TestRelaysOnlyWithoutRelays(t *testing.T) {
	c := insecureClient(t, serveJobs(t, &electing{}))
	_, err := c.ListJobs(client.RelaysOnly(context.Background()), &rdzvv1.ListJobsRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "no relays configured")
}

// A call that is not an agent's stream never goes to a relay: under
// RelaysOnly it has nowhere to go.
func TestRelaysCarryAgentStreamsOnly(t *testing.T) {
	_, agentFiles := relayTLS(t)
	cfg := client.DefaultConfig()
	cfg.Endpoints, cfg.Relays, cfg.Logger = []string{closedPort(t)}, []string{closedPort(t)}, zaptest.NewLogger(t)
	cfg.TLS = &client.TLS{Files: agentFiles}
	c, err := client.New(cfg)
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	_, err = c.ListJobs(client.RelaysOnly(context.Background()), &rdzvv1.ListJobsRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "a relay carries agents' streams only")
	require.Empty(t, client.Dialled(c))
}

// A client with relays that went around them to a controller it could not
// reach holds no connection to that controller afterwards, which gRPC
// would dial again and again in the background (a call that is not an
// agent's stream does not go to a relay at all); a client without relays
// keeps the controller's.
func TestUnreachableControllerForgottenAroundRelays(t *testing.T) {
	relay, ctl := closedPort(t), closedPort(t)
	_, agentFiles := relayTLS(t)
	tests := []struct {
		name   string
		relays []string
		want   []string
	}{
		{name: "with a relay", relays: []string{relay}},
		{name: "without relays", want: []string{ctl}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := client.DefaultConfig()
			cfg.Endpoints, cfg.Relays, cfg.Logger = []string{ctl}, tt.relays, zaptest.NewLogger(t)
			cfg.TLS = &client.TLS{Files: agentFiles}
			c, err := client.New(cfg)
			require.NoError(t, err)
			defer func() { require.NoError(t, c.Close()) }()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = c.ListJobs(ctx, &rdzvv1.ListJobsRequest{})
			require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
			require.ElementsMatch(t, tt.want, client.Dialled(c))
		})
	}
}

// closedPort is a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, l.Close())
	return l.Addr().String()
}
