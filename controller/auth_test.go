package controller_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rdzv/rdzv/agent"
	"github.com/rdzv/rdzv/agent/gpu"
	"github.com/rdzv/rdzv/controller"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// dialRaw connects with a hand-made TLS client presenting cert (none when
// nil), for certificates the pki package would refuse to load itself.
func (c *cluster) dialRaw(cert *pki.Issued) *grpc.ClientConn {
	c.t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(c.ca.Cert)
	conf := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: "127.0.0.1"}
	if cert != nil {
		conf.Certificates = []tls.Certificate{{Certificate: [][]byte{cert.Cert.Raw}, PrivateKey: cert.Key, Leaf: cert.Cert}}
	}
	conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(credentials.NewTLS(conf)))
	require.NoError(c.t, err)
	c.t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// register opens an agent stream on conn, registers as node and returns
// the controller's answer: the Registered message, or why not.
func register(t *testing.T, conn *grpc.ClientConn, node string) error {
	t.Helper()
	return registerOn(t, rdzvv1.NewAgentServiceClient(conn), node)
}

// registerOn is register on an agent service: the controller's, or a
// relay's (dialRelay).
func registerOn(t *testing.T, agents rdzvv1.AgentServiceClient, node string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := agents.Connect(ctx)
	if err != nil {
		return err
	}
	err = stream.Send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Register{Register: &rdzvv1.Register{Node: &rdzvv1.NodeInfo{
		Name: node, Address: "127.0.0.1", NcclInterface: "lo", AgentVersion: "test",
	}}}})
	// io.EOF: the controller refused the stream before the send; Recv says
	// why.
	if !errors.Is(err, io.EOF) {
		require.NoError(t, err)
	}
	m, err := stream.Recv()
	if err != nil {
		return err
	}
	require.NotNil(t, m.GetRegistered())
	return nil
}

func TestUnauthenticatedCallsAreRefused(t *testing.T) {
	c := newCluster(t)
	foreignCA, err := pki.NewCA("foreign", 24*time.Hour, time.Now())
	require.NoError(t, err)
	issueRaw := func(ca *pki.CA, role pki.Role, now time.Time) *pki.Issued {
		is, err := ca.Issue(pki.Request{Identity: pki.Identity{Role: role, Name: "mallory"}, ValidFor: time.Hour, Now: now})
		require.NoError(t, err)
		return is
	}
	expired := issueRaw(c.ca, pki.RoleOperator, time.Now().Add(-2*time.Hour))
	// A refusal closes its connection: each call dials anew.
	tests := []struct {
		name     string
		cert     *pki.Issued
		wantCode codes.Code
		wantMsg  string
	}{
		{"no certificate", nil, codes.Unauthenticated, "no client certificate"},
		{"expired certificate", expired, codes.Unauthenticated, "certificate operator/mallory expired at " + expired.Cert.NotAfter.UTC().Format(time.RFC3339)},
		{"another CA's operator", issueRaw(foreignCA, pki.RoleOperator, time.Now()), codes.Unauthenticated, "certificate not signed by the cluster CA"},
		{"another CA's agent", issueRaw(foreignCA, pki.RoleAgent, time.Now()), codes.Unauthenticated, "certificate not signed by the cluster CA"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := rdzvv1.NewNodeServiceClient(c.dialRaw(tt.cert)).ListNodes(rpcCtx(t), &rdzvv1.ListNodesRequest{})
			require.Equal(t, tt.wantCode, status.Code(err), "%v", err)
			require.ErrorContains(t, err, tt.wantMsg)

			_, err = rdzvv1.NewJobServiceClient(c.dialRaw(tt.cert)).StartJob(rpcCtx(t), &rdzvv1.StartJobRequest{Spec: c.spec("evil", 1, 1, "ok")})
			require.Equal(t, tt.wantCode, status.Code(err), "%v", err)

			err = register(t, c.dialRaw(tt.cert), "mallory")
			require.Equal(t, tt.wantCode, status.Code(err), "%v", err)
			require.ErrorContains(t, err, tt.wantMsg)
		})
	}

	// Plaintext never gets as far as a call.
	plain, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer plain.Close()
	_, err = rdzvv1.NewNodeServiceClient(plain).ListNodes(rpcCtx(t), &rdzvv1.ListNodesRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)

	require.Empty(t, c.listNodes(), "no refused agent registered")
	require.Empty(t, c.listJobs(), "no refused call started a job")
}

// TestRolesPerMethod calls every method with each role and checks who is
// let through. Requests name things that do not exist, so an allowed call
// changes nothing and fails with NotFound or InvalidArgument instead.
func TestRolesPerMethod(t *testing.T) {
	c := newCluster(t)
	type call func(conn *grpc.ClientConn) error
	jobs := func(conn *grpc.ClientConn) rdzvv1.JobServiceClient { return rdzvv1.NewJobServiceClient(conn) }
	nodes := func(conn *grpc.ClientConn) rdzvv1.NodeServiceClient { return rdzvv1.NewNodeServiceClient(conn) }
	calls := map[string]call{
		"GetJob": func(conn *grpc.ClientConn) error {
			_, err := jobs(conn).GetJob(rpcCtx(t), &rdzvv1.GetJobRequest{Name: "nope"})
			return err
		},
		"ListJobs": func(conn *grpc.ClientConn) error {
			_, err := jobs(conn).ListJobs(rpcCtx(t), &rdzvv1.ListJobsRequest{})
			return err
		},
		"ListEvents": func(conn *grpc.ClientConn) error {
			_, err := jobs(conn).ListEvents(rpcCtx(t), &rdzvv1.ListEventsRequest{})
			return err
		},
		"StreamLogs": func(conn *grpc.ClientConn) error {
			s, err := jobs(conn).StreamLogs(rpcCtx(t), &rdzvv1.StreamLogsRequest{Job: "nope"})
			if err == nil {
				_, err = s.Recv()
			}
			return err
		},
		"StartJob": func(conn *grpc.ClientConn) error {
			_, err := jobs(conn).StartJob(rpcCtx(t), &rdzvv1.StartJobRequest{})
			return err
		},
		"StopJob": func(conn *grpc.ClientConn) error {
			_, err := jobs(conn).StopJob(rpcCtx(t), &rdzvv1.StopJobRequest{Name: "nope"})
			return err
		},
		"DeleteJob": func(conn *grpc.ClientConn) error {
			_, err := jobs(conn).DeleteJob(rpcCtx(t), &rdzvv1.DeleteJobRequest{Name: "nope"})
			return err
		},
		"ListNodes": func(conn *grpc.ClientConn) error {
			_, err := nodes(conn).ListNodes(rpcCtx(t), &rdzvv1.ListNodesRequest{})
			return err
		},
		"CordonNode": func(conn *grpc.ClientConn) error {
			_, err := nodes(conn).CordonNode(rpcCtx(t), &rdzvv1.CordonNodeRequest{Name: "nope"})
			return err
		},
		"UncordonNode": func(conn *grpc.ClientConn) error {
			_, err := nodes(conn).UncordonNode(rpcCtx(t), &rdzvv1.UncordonNodeRequest{Name: "nope"})
			return err
		},
	}
	reads := []string{"GetJob", "ListJobs", "ListEvents", "StreamLogs", "ListNodes"}
	writes := []string{"StartJob", "StopJob", "DeleteJob", "CordonNode", "UncordonNode"}
	tests := []struct {
		id      pki.Identity
		allowed []string
	}{
		{pki.Identity{Role: pki.RoleOperator, Name: "alice"}, append(reads, writes...)},
		{pki.Identity{Role: pki.RoleViewer, Name: "bob"}, reads},
		{pki.Identity{Role: pki.RoleAgent, Name: "node-a"}, nil},
		{pki.Identity{Role: pki.RoleController, Name: "other-controller"}, nil},
		{pki.Identity{Role: pki.RoleRelay, Name: "rack-1"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.id.String(), func(t *testing.T) {
			conn := c.dial(c.issue(tt.id))
			for name, call := range calls {
				err := call(conn)
				allowed := false
				for _, a := range tt.allowed {
					allowed = allowed || a == name
				}
				if allowed {
					require.NotContains(t, []codes.Code{codes.PermissionDenied, codes.Unauthenticated}, status.Code(err), "%s may call %s: %v", tt.id, name, err)
					continue
				}
				require.Equal(t, codes.PermissionDenied, status.Code(err), "%s may not call %s: %v", tt.id, name, err)
				require.ErrorContains(t, err, tt.id.String()+" (role "+string(tt.id.Role)+") may not call /rdzv.v1.")
			}
			if tt.id.Role != pki.RoleAgent {
				err := register(t, conn, tt.id.Name)
				require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
				require.ErrorContains(t, err, "it needs a certificate of role agent")
			}
			if tt.id.Role != pki.RoleRelay {
				_, err := carry(t, conn)
				require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
				require.ErrorContains(t, err, "it needs a certificate of role relay")
			}
		})
	}
	require.Empty(t, c.listNodes())
}

// TestViewerCannotChangeJobs: a read-only identity sees a running job but
// can neither stop it nor start another, nor cordon its node.
func TestViewerCannotChangeJobs(t *testing.T) {
	c := newCluster(t)
	a := c.connectFake("node-a")
	a.keepAlive()
	c.startJob(c.spec("train", 1, 1, "hang"))
	a.run()
	c.waitRunning("train")

	conn := c.dial(c.issue(pki.Identity{Role: pki.RoleViewer, Name: "bob"}))
	jobs, nodes := rdzvv1.NewJobServiceClient(conn), rdzvv1.NewNodeServiceClient(conn)
	got, err := jobs.GetJob(rpcCtx(t), &rdzvv1.GetJobRequest{Name: "train"})
	require.NoError(t, err, "a viewer reads")
	require.Equal(t, rdzvv1.JobState_JOB_STATE_RUNNING, got.GetJob().GetState())

	_, err = jobs.StopJob(rpcCtx(t), &rdzvv1.StopJobRequest{Name: "train"})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "viewer/bob (role viewer) may not call /rdzv.v1.JobService/StopJob: it needs a certificate of role operator")
	_, err = jobs.StartJob(rpcCtx(t), &rdzvv1.StartJobRequest{Spec: c.spec("other", 1, 1, "ok")})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	_, err = nodes.CordonNode(rpcCtx(t), &rdzvv1.CordonNodeRequest{Name: "node-a"})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)

	require.Equal(t, rdzvv1.JobState_JOB_STATE_RUNNING, c.getJob("train").GetState(), "the job was not stopped")
	require.Len(t, c.listJobs(), 1, "no job was started")
	require.False(t, c.listNodes()["node-a"].GetCordoned())
}

// TestAgentCannotImpersonateAnotherNode: node-b's certificate cannot
// register as node-a, whose own agent stays connected and in charge.
func TestAgentCannotImpersonateAnotherNode(t *testing.T) {
	c := newCluster(t)
	a := c.connectFake("node-a")
	a.keepAlive()

	impostor := c.dial(c.issue(pki.Identity{Role: pki.RoleAgent, Name: "node-b"}))
	err := register(t, impostor, "node-a")
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	require.ErrorContains(t, err, `agent/node-b may not register node "node-a": an agent registers only as the node named in its certificate`)
	require.NoError(t, register(t, impostor, "node-b"), "the same certificate registers as its own node")

	require.False(t, a.closed(), "node-a's own stream was not replaced")
	nodes := c.listNodes()
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_READY, nodes["node-a"].GetState())
	registrations := 0
	for _, ev := range c.events("") {
		if ev.GetKind() == "node_registered" && ev.GetNode() == "node-a" {
			registrations++
		}
	}
	require.Equal(t, 1, registrations, "node-a registered once, by its own agent")

	// The real agent refuses to start with another node's certificate.
	cfg := agent.DefaultConfig()
	cfg.Controller, cfg.NodeName, cfg.StateDir = c.addr, "node-a", t.TempDir()
	cfg.TLS = c.issue(pki.Identity{Role: pki.RoleAgent, Name: "node-b"})
	_, err = agent.New(cfg, testLogger(t), gpu.Fake{}, loopbackOnly{}, agent.ExecSpawner{})
	require.ErrorContains(t, err, `is the certificate of agent/node-b, but this is node "node-a"`)
}

// TestCertificateRotation: the controller serves a rotated certificate to
// new connections without a restart.
func TestCertificateRotation(t *testing.T) {
	c := newCluster(t)
	served := func() *big.Int {
		var (
			mu     sync.Mutex
			serial *big.Int
		)
		roots := x509.NewCertPool()
		roots.AddCert(c.ca.Cert)
		is, err := c.ca.Issue(pki.Request{Identity: pki.Identity{Role: pki.RoleViewer, Name: "probe"}, ValidFor: time.Hour, Now: time.Now()})
		require.NoError(t, err)
		conf := &tls.Config{
			MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: "127.0.0.1",
			Certificates: []tls.Certificate{{Certificate: [][]byte{is.Cert.Raw}, PrivateKey: is.Key}},
			VerifyConnection: func(cs tls.ConnectionState) error {
				mu.Lock()
				defer mu.Unlock()
				serial = cs.PeerCertificates[0].SerialNumber
				return nil
			},
		}
		conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(credentials.NewTLS(conf)))
		require.NoError(t, err)
		defer conn.Close()
		_, err = rdzvv1.NewNodeServiceClient(conn).ListNodes(rpcCtx(t), &rdzvv1.ListNodesRequest{})
		require.NoError(t, err)
		mu.Lock()
		defer mu.Unlock()
		return serial
	}
	before := served()
	files := c.issue(pki.Identity{Role: pki.RoleController, Name: "controller"}, net.IPv4(127, 0, 0, 1))
	require.Equal(t, c.cfg.TLS.Files, files, "rotated in place")
	rotated, err := pki.ReadCert(files.Cert)
	require.NoError(t, err)
	require.NotEqual(t, before, rotated.SerialNumber)
	poll(t, func() bool { return served().Cmp(rotated.SerialNumber) == 0 },
		func() string { return "the controller still serves serial " + before.String() })

	// Connections made before the rotation keep working.
	_, err = c.nodes.ListNodes(rpcCtx(t), &rdzvv1.ListNodesRequest{})
	require.NoError(t, err)
}

// TestInsecureController: with insecure set, the controller serves
// plaintext without asking who calls; nothing else changes.
func TestInsecureController(t *testing.T) {
	c := newCluster(t, func(cfg *controller.Config) { cfg.Insecure, cfg.TLS = true, controller.TLSConfig{} })
	plain, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer plain.Close()
	require.NoError(t, register(t, plain, "node-a"))
	_, err = rdzvv1.NewNodeServiceClient(plain).ListNodes(rpcCtx(t), &rdzvv1.ListNodesRequest{})
	require.NoError(t, err)
}

// TestExpiredCertificateClosesItsConnection: an agent stream outlives the
// handshake that authenticated it, so the controller ends it when the
// certificate expires, saying so, and closes the connection; presented
// again, it is refused with why.
func TestExpiredCertificateClosesItsConnection(t *testing.T) {
	c := newCluster(t)
	files, issued := c.issueFor(pki.Identity{Role: pki.RoleAgent, Name: "node-a"}, 3*time.Second)
	f := c.connectFakeWith(files, "node-a")
	f.keepAlive()

	err := f.waitEnd()
	require.True(t, time.Now().After(issued.Cert.NotAfter), "ended before the certificate expired: %v", err)
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "expired at "+issued.Cert.NotAfter.UTC().Format(time.RFC3339))
	err = register(t, c.dialRaw(issued), "node-a")
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "expired at")
}

// TestAgentCertificateRenewal: an agent whose certificate expires carries
// on with the one renewed on disk, without a restart; renewed in time, its
// node is never lost.
func TestAgentCertificateRenewal(t *testing.T) {
	tests := []struct {
		name string
		// early renews the certificate before it expires.
		early bool
	}{
		{"renewed before it expires", true},
		{"renewed after it expired", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Renewed early, the agent reconnects in well under a second; a
			// longer heartbeat timeout keeps a slow machine from failing
			// that, and is still waited out below.
			timeout := heartbeatTimeout
			if tt.early {
				timeout = 3 * time.Second
			}
			c := newCluster(t, func(cfg *controller.Config) { cfg.Heartbeat.Timeout.Duration = timeout })
			id := pki.Identity{Role: pki.RoleAgent, Name: "node-a"}
			// Issued in the option, after addAgent's own certificate for the
			// node, to the same files.
			var short *pki.Issued
			c.addAgent("node-a", 0, nil, func(cfg *agent.Config) { cfg.TLS, short = c.issueFor(id, 3*time.Second) })
			cert := short.Cert

			if tt.early {
				c.issue(id)
				// Waited out in real time, not on a fake clock: the
				// controller verifies certificates against the wall clock
				// (crypto/tls, pki.Reloader) and the agent reconnects and
				// heartbeats in real time; what is tested is that the agent
				// is back with its renewed certificate before its real
				// silence reaches the heartbeat timeout.
				time.Sleep(time.Until(cert.NotAfter) + timeout + time.Second)
				require.NotContains(t, eventKinds(c.events("")), controller.EventNodeLost)
			} else {
				c.waitNode("node-a", func(n *rdzvv1.Node) bool { return n.GetState() == rdzvv1.NodeState_NODE_STATE_LOST })
				require.True(t, time.Now().After(cert.NotAfter), "lost before its certificate expired")
				c.issue(id)
			}
			c.waitNode("node-a", func(n *rdzvv1.Node) bool { return n.GetState() == rdzvv1.NodeState_NODE_STATE_READY })
			c.startJob(c.spec("train", 1, 1, "ok"))
			c.waitJobState("train", succeeded)
		})
	}
}

// TestCertificateExpiryWarning: an agent connected with a certificate that
// expires within two weeks gets one event saying so, naming the node and
// how to renew; one valid for longer gets none. More agents than one pass
// warns about are all warned, over several passes.
func TestCertificateExpiryWarning(t *testing.T) {
	// On a fake clock that stands still, no liveness pass runs but those
	// this test runs.
	c := newFakeClockCluster(t)
	var soon []string
	for i := range 10 {
		name := fmt.Sprintf("node-%d", i)
		files, _ := c.issueFor(pki.Identity{Role: pki.RoleAgent, Name: name}, 24*time.Hour)
		c.connectFakeWith(files, name).keepAlive()
		soon = append(soon, name)
	}
	later, _ := c.issueFor(pki.Identity{Role: pki.RoleAgent, Name: "node-later"}, 30*24*time.Hour)
	c.connectFakeWith(later, "node-later").keepAlive()

	warned := func() []string {
		var nodes []string
		for _, ev := range c.events("") {
			if ev.GetKind() == controller.EventCertExpiring {
				nodes = append(nodes, ev.GetNode())
				require.Contains(t, ev.GetMessage(), "the certificate of agent "+ev.GetNode()+" expires at")
				require.Contains(t, ev.GetMessage(), "rdzvctl pki issue agent "+ev.GetNode())
			}
		}
		slices.Sort(nodes)
		return nodes
	}
	c.checkLiveness()
	require.Len(t, warned(), 8, "one pass warns of 8 agents at most")
	for range 10 {
		c.checkLiveness()
	}
	require.Equal(t, soon, warned(), "once per connection, and only for certificates about to expire")
}

// A client that reconnects to a restarted controller resumes its TLS
// session, and its calls are still authenticated by its certificate: the
// ticket keys derive from the secrets keyring, not from the process.
func TestTLSSessionsSurviveARestart(t *testing.T) {
	c := newCluster(t)
	r, err := pki.NewReloader(c.issue(pki.Identity{Role: pki.RoleOperator, Name: "alice"}), nil, testLogger(t))
	require.NoError(t, err)
	call := func() (resumed bool) {
		t.Helper()
		conf, err := r.ClientConfig(c.addr)
		require.NoError(t, err)
		own := conf.VerifyConnection
		var did atomic.Bool
		conf.VerifyConnection = func(cs tls.ConnectionState) error {
			did.Store(cs.DidResume)
			return own(cs)
		}
		conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(credentials.NewTLS(conf)))
		require.NoError(t, err)
		defer conn.Close()
		_, err = rdzvv1.NewNodeServiceClient(conn).ListNodes(rpcCtx(t), &rdzvv1.ListNodesRequest{})
		require.NoError(t, err)
		return did.Load()
	}
	require.False(t, call(), "the first connection")
	require.True(t, call(), "a reconnect resumes")
	c.stopController()
	c.startController()
	require.True(t, call(), "a reconnect to the restarted controller resumes too")
}
