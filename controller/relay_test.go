package controller_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/agent"
	"github.com/rdzv/rdzv/client"
	"github.com/rdzv/rdzv/internal/testaddr"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/relay"
	"github.com/rdzv/rdzv/wire"
)

// runningRelay is an in-process rdzv-relay in front of the cluster's
// controller.
type runningRelay struct {
	relay *relay.Relay
	addr  string
	stop  func()
}

// startRelay runs a relay named name until the test ends; stop ends it
// earlier, as SIGTERM would.
func (c *cluster) startRelay(name string) *runningRelay {
	c.t.Helper()
	return c.startRelayAt(name, testaddr.Free(c.t))
}

// startRelayAt is startRelay listening on addr.
func (c *cluster) startRelayAt(name, addr string) *runningRelay {
	t := c.t
	t.Helper()
	cfg := relay.DefaultConfig()
	cfg.Listen = addr
	cfg.Controller = c.addr
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.RevocationsRefresh.Duration = time.Second
	cfg.TLS = c.issue(pki.Identity{Role: pki.RoleRelay, Name: name}, net.IPv4(127, 0, 0, 1))
	r, err := relay.New(cfg, c.log.Named(name))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case <-r.Ready():
	case err := <-done:
		cancel()
		require.NoError(t, err, "relay exited before serving")
	case <-time.After(waitTimeout):
		cancel()
		require.FailNow(t, "relay not ready")
	}
	stopped := false
	rr := &runningRelay{relay: r, addr: cfg.Listen, stop: func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		require.NoError(t, <-done)
	}}
	t.Cleanup(rr.stop)
	return rr
}

// streams is the relay's rdzv_relay_streams, read from its /metrics.
func (r *runningRelay) streams(t *testing.T) string {
	t.Helper()
	resp, err := http.Get("http://" + r.relay.HTTPAddr().String() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "rdzv_relay_streams "); ok {
			return v
		}
	}
	return ""
}

// dialRelay is an agent's service through the relay with files, as an
// agent whose relays setting names it reaches it: its streams go to the
// relay only (client.RelaysOnly), in frames.
func (c *cluster) dialRelay(r *runningRelay, files pki.Files) rdzvv1.AgentServiceClient {
	c.t.Helper()
	cfg := client.DefaultConfig()
	cfg.Endpoints, cfg.Relays, cfg.TLS, cfg.Logger = []string{c.addr}, []string{r.addr}, &client.TLS{Files: files}, testLogger(c.t)
	cl, err := client.New(cfg)
	require.NoError(c.t, err)
	c.t.Cleanup(func() { _ = cl.Close() })
	return relaysOnly{cl}
}

// relaysOnly opens its streams through the client's relays only.
type relaysOnly struct{ *client.Client }

func (r relaysOnly) Connect(ctx context.Context, opts ...grpc.CallOption) (grpc.BidiStreamingClient[rdzvv1.ConnectRequest, rdzvv1.ConnectResponse], error) {
	return r.Client.Connect(client.RelaysOnly(ctx), opts...)
}

// TestRelayCarriesAgents: agents whose relays setting names a relay reach
// the controller through it, run a job, and when the relay stops, reach
// the controller directly with their workers still running: the job goes
// on in the same generation.
func TestRelayCarriesAgents(t *testing.T) {
	c := newCluster(t)
	r := c.startRelay("rack-1")
	viaRelay := func(cfg *agent.Config) { cfg.Relays = r.addr }
	a := c.addAgent("node-a", 1, nil, viaRelay)
	b := c.addAgent("node-b", 1, nil, viaRelay)
	poll(t, func() bool { return r.streams(t) == "2" }, func() string { return "the relay carries " + r.streams(t) + " streams, not both agents'" })
	viaRelayGauge := func(ra *runningAgent) float64 {
		return scrape(t, ra.agent.HTTP().Addr().String()).gauge(t, "rdzv_agent_via_relay")
	}
	// The controller lists a node ready before its agent has read the
	// answer.
	poll(t, func() bool { return viaRelayGauge(a) == 1 && viaRelayGauge(b) == 1 }, func() string { return "the agents never said they went through the relay" })
	m := scrape(t, c.httpAddr())
	require.Equal(t, 2.0, m.gauge(t, "rdzv_connected_agents"))
	require.Equal(t, 2.0, m.gauge(t, "rdzv_relayed_agents"))
	require.Equal(t, 1.0, m.gauge(t, "rdzv_connected_relays"))

	c.startJob(c.spec("relayed", 2, 2, "hang"))
	job := c.waitRunning("relayed")
	gen := job.GetGeneration()
	// Counted on the agents' side: the controller logs a node's first
	// registration only.
	registered := func(node string) int {
		return c.logs.FilterMessage("registered with controller").FilterField(zap.String("node", node)).Len()
	}
	require.Equal(t, 1, registered("node-a"))
	require.Equal(t, 1, registered("node-b"))

	r.stop()
	poll(t, func() bool { return registered("node-a") == 2 && registered("node-b") == 2 }, func() string { return "the agents did not reach the controller directly" })
	c.waitNode("node-a", func(n *rdzvv1.Node) bool { return n.GetState() == rdzvv1.NodeState_NODE_STATE_BUSY })
	c.waitNode("node-b", func(n *rdzvv1.Node) bool { return n.GetState() == rdzvv1.NodeState_NODE_STATE_BUSY })
	require.Zero(t, viaRelayGauge(a), "direct now")
	require.Zero(t, viaRelayGauge(b), "direct now")
	m = scrape(t, c.httpAddr())
	require.Equal(t, 2.0, m.gauge(t, "rdzv_connected_agents"))
	require.Zero(t, m.gauge(t, "rdzv_relayed_agents"), "direct now")
	// The relay's call ends as the controller notices its connection gone.
	poll(t, func() bool { return scrape(t, c.httpAddr()).gauge(t, "rdzv_connected_relays") == 0 }, func() string { return "the stopped relay still counts" })
	job = c.getJob("relayed")
	require.Equal(t, rdzvv1.JobState_JOB_STATE_RUNNING, job.GetState())
	require.Equal(t, gen, job.GetGeneration(), "the relay's stop did not restart the job")
	for _, ev := range c.events("relayed") {
		require.NotEqual(t, "job_restarting", ev.GetKind(), "%v", ev)
	}
}

// carry opens a Carry call on conn, as a relay does, and returns it once
// the controller said it serves it.
func carry(t *testing.T, conn *grpc.ClientConn) (rdzvv1.RelayService_CarryClient, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	stream, err := rdzvv1.NewRelayServiceClient(conn).Carry(ctx)
	if err != nil {
		return nil, err
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	require.Empty(t, first.GetFrames(), "the first response only says the call is served")
	return stream, nil
}

// frame is a message of one frame.
func frame(f *rdzvv1.UpFrame) *rdzvv1.CarryRequest {
	return &rdzvv1.CarryRequest{Frames: []*rdzvv1.UpFrame{f}}
}

// openCarried opens stream id on a Carry call for chain (DER) registering
// node.
func openCarried(t *testing.T, stream rdzvv1.RelayService_CarryClient, id uint64, node string, chain [][]byte) {
	t.Helper()
	require.NoError(t, stream.Send(frame(&rdzvv1.UpFrame{StreamId: id, Frame: &rdzvv1.UpFrame_Open{Open: &rdzvv1.OpenStream{CertificateChain: chain,
		Register: &rdzvv1.Register{Node: &rdzvv1.NodeInfo{Name: node, Address: "127.0.0.1", NcclInterface: "lo", AgentVersion: "test"}}}}})))
}

// requestFrame is an agent's message on carried stream id, encoded as the
// relay passes it on.
func requestFrame(t *testing.T, id uint64, m *rdzvv1.ConnectRequest) *rdzvv1.CarryRequest {
	t.Helper()
	b, err := proto.Marshal(m)
	require.NoError(t, err)
	return frame(&rdzvv1.UpFrame{StreamId: id, Frame: &rdzvv1.UpFrame_Request{Request: b}})
}

// response is the message a frame carries to its agent, decoded as the
// agent decodes it.
func response(t *testing.T, f *rdzvv1.DownFrame) *rdzvv1.ConnectResponse {
	t.Helper()
	m := &rdzvv1.ConnectResponse{}
	require.NoError(t, proto.Unmarshal(f.GetResponse(), m), "%v", f)
	return m
}

// nextFrame is the next frame the controller sends on a Carry call.
func nextFrame(t *testing.T, stream rdzvv1.RelayService_CarryClient, pending *[]*rdzvv1.DownFrame) *rdzvv1.DownFrame {
	t.Helper()
	for len(*pending) == 0 {
		resp, err := stream.Recv()
		require.NoError(t, err)
		*pending = resp.GetFrames()
	}
	f := (*pending)[0]
	*pending = (*pending)[1:]
	return f
}

// endStatus is how a carried stream's end frame says it ended.
func endStatus(f *rdzvv1.DownFrame) error {
	if end := f.GetEnd(); end != nil {
		return status.Error(codes.Code(end.GetCode()), end.GetMessage())
	}
	return nil
}

// TestRelayedRefusals: a relay's certificate speaks only for the agents
// whose verified certificates it forwards, and only as those nodes; each
// refusal ends the agent's stream, never the relay's call.
func TestRelayedRefusals(t *testing.T) {
	c := newCluster(t)
	chain := func(id pki.Identity) [][]byte {
		files := c.issue(id)
		cert, err := pki.ReadCert(files.Cert)
		require.NoError(t, err)
		return [][]byte{cert.Raw}
	}
	foreign, err := pki.NewCA("foreign", time.Hour, time.Now())
	require.NoError(t, err)
	foreignAgent, err := foreign.Issue(pki.Request{Identity: pki.Identity{Role: pki.RoleAgent, Name: "node-a"}, ValidFor: time.Minute, Now: time.Now()})
	require.NoError(t, err)
	junk := [][]byte{[]byte("a")}
	stream, err := carry(t, c.dial(c.issue(pki.Identity{Role: pki.RoleRelay, Name: "rack-1"})))
	require.NoError(t, err)
	var pending []*rdzvv1.DownFrame
	tests := []struct {
		name  string
		chain [][]byte
		node  string
		code  codes.Code
		want  string
	}{
		{"no chain", nil, "node-a", codes.PermissionDenied, "its certificate_chain must hold 1 to 4 certificates, got 0"},
		{"too long a chain", append(append(append(append(append([][]byte{}, junk...), junk...), junk...), junk...), junk...), "node-a", codes.PermissionDenied, "got 5"},
		{"not a certificate", junk, "node-a", codes.Unauthenticated, "relayed certificate 0 of relay/rack-1"},
		{"another CA's agent", [][]byte{foreignAgent.Cert.Raw}, "node-a", codes.Unauthenticated, "agent certificate relayed by relay/rack-1"},
		{"an operator", chain(pki.Identity{Role: pki.RoleOperator, Name: "alice"}), "alice", codes.PermissionDenied, "relay/rack-1 relayed the certificate of operator/alice: a relay carries agents only"},
		{"another node", chain(pki.Identity{Role: pki.RoleAgent, Name: "node-b"}), "node-a", codes.PermissionDenied, `agent/node-b may not register node "node-a"`},
		{"an invalid registration", chain(pki.Identity{Role: pki.RoleAgent, Name: "node-a"}), "", codes.InvalidArgument, "node.name"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := uint64(i + 1)
			openCarried(t, stream, id, tt.node, tt.chain)
			f := nextFrame(t, stream, &pending)
			require.Equal(t, id, f.GetStreamId())
			err := endStatus(f)
			require.Equal(t, tt.code, status.Code(err), "%v", err)
			require.ErrorContains(t, err, tt.want)
		})
	}
	require.Empty(t, c.listNodes(), "no refused stream registered a node")

	openCarried(t, stream, 100, "node-a", chain(pki.Identity{Role: pki.RoleAgent, Name: "node-a"}))
	f := nextFrame(t, stream, &pending)
	require.Equal(t, uint64(100), f.GetStreamId())
	require.NotNil(t, response(t, f).GetRegistered(), "the agent's own chain, for its own node, on the same call: %v", f)

	// A frame with nothing in it is the relay's fault: the call ends.
	require.NoError(t, stream.Send(frame(&rdzvv1.UpFrame{StreamId: 101})))
	for {
		_, err = stream.Recv()
		if err != nil {
			break
		}
	}
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "frame of stream 101: no open, request or close")
}

// TestCarriedInvalidMessage: an agent's invalid message, or one that does
// not decode, ends its own carried stream, with the reason, and not its
// neighbours' on the call.
func TestCarriedInvalidMessage(t *testing.T) {
	emptyJob, err := proto.Marshal(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Progress{Progress: &rdzvv1.Progress{Job: ""}}})
	require.NoError(t, err)
	tests := []struct {
		name    string
		request []byte
		want    string
	}{
		{"a field's value refused", emptyJob, "progress.job"},
		{"not a ConnectRequest", []byte{0xff, 0xff}, "does not decode as a ConnectRequest"},
		// Field 1 (register), length 3, of which one byte is there.
		{"cut short", []byte{0x0a, 0x03, 0x0a}, "does not decode as a ConnectRequest"},
	}
	c := newCluster(t)
	stream, err := carry(t, c.dial(c.issue(pki.Identity{Role: pki.RoleRelay, Name: "rack-1"})))
	require.NoError(t, err)
	var pending []*rdzvv1.DownFrame
	open := func(id uint64, node string) {
		cert, err := pki.ReadCert(c.issue(pki.Identity{Role: pki.RoleAgent, Name: node}).Cert)
		require.NoError(t, err)
		openCarried(t, stream, id, node, [][]byte{cert.Raw})
		f := nextFrame(t, stream, &pending)
		require.NotNil(t, response(t, f).GetRegistered(), "%v", f)
	}
	neighbour := uint64(len(tests) + 1)
	open(neighbour, "node-n")
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := uint64(i + 1)
			open(id, fmt.Sprintf("node-%d", i))
			require.NoError(t, stream.Send(frame(&rdzvv1.UpFrame{StreamId: id, Frame: &rdzvv1.UpFrame_Request{Request: tt.request}})))
			f := nextFrame(t, stream, &pending)
			require.Equal(t, id, f.GetStreamId())
			err := endStatus(f)
			require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
			require.ErrorContains(t, err, tt.want)

			require.NoError(t, stream.Send(requestFrame(t, neighbour, &rdzvv1.ConnectRequest{
				Msg: &rdzvv1.ConnectRequest_Heartbeat{Heartbeat: &rdzvv1.Heartbeat{Seq: id}}})))
			f = nextFrame(t, stream, &pending)
			require.Equal(t, neighbour, f.GetStreamId())
			require.Equal(t, id, response(t, f).GetHeartbeatAck().GetSeq(), "the neighbour's stream goes on: %v", f)
		})
	}
}

// TestRelayRefusesNonAgents: the relay itself carries agents only, and
// only with a certificate of the cluster's CA.
func TestRelayRefusesNonAgents(t *testing.T) {
	c := newCluster(t)
	r := c.startRelay("rack-1")
	err := registerOn(t, c.dialRelay(r, c.issue(pki.Identity{Role: pki.RoleOperator, Name: "alice"})), "alice")
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "operator/alice may not call /rdzv.v1.AgentService/Connect through a relay: it carries agents only")

	// An agent dialling the relay's address checks that it is a relay's.
	rl, err := pki.NewReloader(c.issue(pki.Identity{Role: pki.RoleAgent, Name: "node-a"}), nil, testLogger(t))
	require.NoError(t, err)
	conf, err := rl.RelayClientConfig(c.addr)
	require.NoError(t, err)
	conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(credentials.NewTLS(conf)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	err = register(t, conn, "node-a")
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "presented the certificate of controller/controller, not of a relay")
	require.Empty(t, c.listNodes())
}

// TestRelayedAgentRevoked: revoking an agent's certificate ends its stream
// through the relay, and only its: the relay's other agents stay.
func TestRelayedAgentRevoked(t *testing.T) {
	c := newCluster(t, withReverify)
	r := c.startRelay("rack-1")
	a := c.connectFakeOn(c.dialRelay(r, c.issue(pki.Identity{Role: pki.RoleAgent, Name: "node-a"})), "node-a")
	a.keepAlive()
	b := c.connectFakeOn(c.dialRelay(r, c.issue(pki.Identity{Role: pki.RoleAgent, Name: "node-b"})), "node-b")
	b.keepAlive()
	_, err := c.certs.RevokeCertificate(rpcCtx(t), &rdzvv1.RevokeCertificateRequest{
		Target: &rdzvv1.RevokeCertificateRequest_Identity{Identity: "agent/node-a"}, Reason: "stolen"})
	require.NoError(t, err)
	err = a.waitEnd()
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "stolen")
	c.waitNode("node-a", func(n *rdzvv1.Node) bool { return n.GetState() == rdzvv1.NodeState_NODE_STATE_LOST })
	b.heartbeat(1)
	require.False(t, b.closed(), "the relay's other agent is not touched")
}

// TestRelayHoldsThroughRestart: while the controller restarts, the relay
// holds its agents' new streams, and they register again through it once
// the controller leads: no agent goes around its relay, and the job keeps
// its generation.
func TestRelayHoldsThroughRestart(t *testing.T) {
	c := newCluster(t)
	r := c.startRelay("rack-1")
	viaRelay := func(cfg *agent.Config) { cfg.Relays = r.addr }
	a := c.addAgent("node-a", 1, nil, viaRelay)
	b := c.addAgent("node-b", 1, nil, viaRelay)
	c.startJob(c.spec("held", 2, 2, "hang"))
	gen := c.waitRunning("held").GetGeneration()
	registered := func(node string) int {
		return c.logs.FilterMessage("registered with controller").FilterField(zap.String("node", node)).Len()
	}
	require.Equal(t, 1, registered("node-a"))
	require.Equal(t, 1, registered("node-b"))

	c.stopController()
	c.startController()
	poll(t, func() bool { return registered("node-a") == 2 && registered("node-b") == 2 }, func() string { return "the agents did not register again" })
	for _, ra := range []*runningAgent{a, b} {
		require.Equal(t, float64(1), scrape(t, ra.agent.HTTP().Addr().String()).gauge(t, "rdzv_agent_via_relay"), "still through the relay")
	}
	require.Equal(t, "2", r.streams(t))
	job := c.waitRunning("held")
	require.Equal(t, gen, job.GetGeneration(), "the restart did not restart the job")
}

// TestAgentComesBackThroughItsRelay: an agent whose relay was away when it
// registered comes back through it once it serves (relay_return),
// registering there before it drops its direct stream: its node is never
// lost, and its job keeps its generation.
func TestAgentComesBackThroughItsRelay(t *testing.T) {
	c := newCluster(t)
	addr := testaddr.Free(t)
	a := c.addAgent("node-a", 1, nil, func(cfg *agent.Config) {
		cfg.Relays = addr
		cfg.RelayReturn.Duration = agent.MinRelayReturn
	})
	c.startJob(c.spec("back", 1, 1, "hang"))
	gen := c.waitRunning("back").GetGeneration()
	viaRelay := func() float64 { return scrape(t, a.agent.HTTP().Addr().String()).gauge(t, "rdzv_agent_via_relay") }
	require.Equal(t, float64(0), viaRelay(), "around the relay, which is not there")

	r := c.startRelayAt("rack-1", addr)
	poll(t, func() bool { return viaRelay() == 1 }, func() string { return "the agent did not come back through its relay" })
	require.Equal(t, "1", r.streams(t))
	require.Zero(t, c.logs.FilterMessage("node lost").Len(), "the node was never lost")
	require.Equal(t, 2, c.logs.FilterMessage("registered with controller").FilterField(zap.String("node", "node-a")).Len())
	require.Equal(t, gen, c.waitRunning("back").GetGeneration(), "coming back did not restart the job")
}

// dialFramed opens an agent's stream in frames to the relay with files,
// as an agent that speaks wire.AgentProtocol does, and registers node.
func (c *cluster) dialFramed(r *runningRelay, files pki.Files, node string) *tls.Conn {
	t := c.t
	t.Helper()
	conn := c.sendFramedRegister(r, files, node)
	kind, p, err := wire.ReadFrame(conn)
	require.NoError(t, err)
	require.Equal(t, wire.FrameMessage, kind)
	var m rdzvv1.ConnectResponse
	require.NoError(t, proto.Unmarshal(p, &m))
	require.NotNil(t, m.GetRegistered(), "%v", &m)
	return conn
}

// sendFramedRegister connects to the relay in frames with files and sends
// the register of node.
func (c *cluster) sendFramedRegister(r *runningRelay, files pki.Files, node string) *tls.Conn {
	t := c.t
	t.Helper()
	rl, err := pki.NewReloader(files, nil, testLogger(t))
	require.NoError(t, err)
	conf, err := rl.RelayClientConfig(r.addr)
	require.NoError(t, err)
	conf.NextProtos = []string{wire.AgentProtocol}
	conn, err := tls.Dial("tcp", r.addr, conf)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	require.Equal(t, wire.AgentProtocol, conn.ConnectionState().NegotiatedProtocol)
	writeFramedRegister(t, conn, node)
	return conn
}

// writeFramedRegister sends the register of node on conn, in frames.
func writeFramedRegister(t *testing.T, conn *tls.Conn, node string) {
	t.Helper()
	b, err := wire.AppendMessage(nil, &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Register{Register: &rdzvv1.Register{Node: &rdzvv1.NodeInfo{
		Name: node, Address: "127.0.0.1", NcclInterface: "lo", AgentVersion: "test"}}}})
	require.NoError(t, err)
	_, err = conn.Write(b)
	require.NoError(t, err)
}

// TestFramedAgentStreams: the relay carries agents only, and passes their
// messages on without decoding them; an agent's message that does not decode ends its own
// stream, with the reason, and the connection carries the agent's next
// stream; its neighbour's stream goes on, pings answered.
func TestFramedAgentStreams(t *testing.T) {
	c := newCluster(t)
	r := c.startRelay("rack-1")
	operator := c.sendFramedRegister(r, c.issue(pki.Identity{Role: pki.RoleOperator, Name: "alice"}), "alice")
	kind, p, err := wire.ReadFrame(operator)
	require.NoError(t, err)
	require.Equal(t, wire.FrameEnd, kind)
	st, err := wire.EndStatus(p)
	require.NoError(t, err)
	require.Equal(t, codes.PermissionDenied, st.Code(), "%v", st)
	require.Contains(t, st.Message(), "operator/alice may not call /rdzv.v1.AgentService/Connect through a relay")
	require.Empty(t, c.listNodes())

	bad := c.dialFramed(r, c.issue(pki.Identity{Role: pki.RoleAgent, Name: "node-a"}), "node-a")
	good := c.dialFramed(r, c.issue(pki.Identity{Role: pki.RoleAgent, Name: "node-b"}), "node-b")
	poll(t, func() bool { return r.streams(t) == "2" }, func() string { return "the relay carries " + r.streams(t) + " streams" })

	_, err = bad.Write(wire.AppendFrame(nil, wire.FrameMessage, []byte{0xff, 0xff}))
	require.NoError(t, err)
	kind, p, err = wire.ReadFrame(bad)
	require.NoError(t, err)
	require.Equal(t, wire.FrameEnd, kind)
	st, err = wire.EndStatus(p)
	require.NoError(t, err)
	require.Equal(t, codes.InvalidArgument, st.Code(), "%v", st)
	require.Contains(t, st.Message(), "does not decode as a ConnectRequest")
	poll(t, func() bool { return r.streams(t) == "1" }, func() string { return "the relay carries " + r.streams(t) + " streams" })
	writeFramedRegister(t, bad, "node-a")
	kind, p, err = wire.ReadFrame(bad)
	require.NoError(t, err)
	require.Equal(t, wire.FrameMessage, kind)
	var again rdzvv1.ConnectResponse
	require.NoError(t, proto.Unmarshal(p, &again))
	require.NotNil(t, again.GetRegistered(), "the next stream, on the same connection: %v", &again)
	poll(t, func() bool { return r.streams(t) == "2" }, func() string { return "the relay carries " + r.streams(t) + " streams" })
	require.NoError(t, bad.Close())

	b := wire.AppendFrame(nil, wire.FramePing, nil)
	b, err = wire.AppendMessage(b, &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Heartbeat{Heartbeat: &rdzvv1.Heartbeat{Seq: 1}}})
	require.NoError(t, err)
	_, err = good.Write(b)
	require.NoError(t, err)
	kind, _, err = wire.ReadFrame(good)
	require.NoError(t, err)
	require.Equal(t, wire.FramePong, kind)
	kind, p, err = wire.ReadFrame(good)
	require.NoError(t, err)
	require.Equal(t, wire.FrameMessage, kind)
	var m rdzvv1.ConnectResponse
	require.NoError(t, proto.Unmarshal(p, &m))
	require.Equal(t, uint64(1), m.GetHeartbeatAck().GetSeq(), "the neighbour's stream goes on: %v", &m)
	poll(t, func() bool { return r.streams(t) == "1" }, func() string { return "the relay carries " + r.streams(t) + " streams" })
}
