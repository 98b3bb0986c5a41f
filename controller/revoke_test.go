package controller_test

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rdzv/rdzv/controller"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// reverifyInterval is short here so that the tests that wait for a
// periodic re-verification are quick.
const reverifyInterval = 200 * time.Millisecond

func withReverify(cfg *controller.Config) { cfg.TLS.ReverifyInterval.Duration = reverifyInterval }

// TestRevokedAgentIsDisconnected: revoking a connected agent's certificate,
// by identity or by serial, ends its open stream with Unauthenticated
// saying so; the same certificate is refused when the agent reconnects,
// and its node is lost. A certificate issued after an identity's
// revocation is accepted, and other agents carry on.
func TestRevokedAgentIsDisconnected(t *testing.T) {
	tests := []struct {
		name string
		// request revokes the certificate whose serial is given.
		request func(serial string) *rdzvv1.RevokeCertificateRequest
	}{
		{"by identity", func(string) *rdzvv1.RevokeCertificateRequest {
			return &rdzvv1.RevokeCertificateRequest{Target: &rdzvv1.RevokeCertificateRequest_Identity{Identity: "agent/node-a"}, Reason: "node decommissioned"}
		}},
		{"by serial", func(serial string) *rdzvv1.RevokeCertificateRequest {
			return &rdzvv1.RevokeCertificateRequest{Target: &rdzvv1.RevokeCertificateRequest_Serial{Serial: serial}, Reason: "node decommissioned"}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t, withReverify)
			files := c.issue(pki.Identity{Role: pki.RoleAgent, Name: "node-a"})
			cert, err := pki.ReadCert(files.Cert)
			require.NoError(t, err)
			a := c.connectFakeWith(files, "node-a")
			a.keepAlive()
			b := c.connectFake("node-b")
			b.keepAlive()

			resp, err := c.certs.RevokeCertificate(rpcCtx(t), tt.request(pki.Serial(cert)))
			require.NoError(t, err)
			require.Equal(t, "operator/test-operator", resp.GetRevocation().GetRevokedBy())
			require.Equal(t, "node decommissioned", resp.GetRevocation().GetReason())
			require.True(t, resp.GetRevocation().GetNotAfter().AsTime().After(cert.NotAfter.Add(-time.Second)),
				"the entry is kept at least as long as the certificate lives")

			err = a.waitEnd()
			require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
			msg := status.Convert(err).Message()
			require.Contains(t, msg, "certificate agent/node-a (serial "+pki.Serial(cert)+") revoked at")
			require.Contains(t, msg, "by operator/test-operator")
			require.Contains(t, msg, "node decommissioned")

			err = register(t, c.dial(files), "node-a")
			require.Equal(t, codes.Unauthenticated, status.Code(err), "the revoked certificate reconnecting: %v", err)
			require.Contains(t, status.Convert(err).Message(), "revoked")
			c.waitNode("node-a", func(n *rdzvv1.Node) bool { return n.GetState() == rdzvv1.NodeState_NODE_STATE_LOST })

			b.heartbeat(1)
			require.False(t, b.closed(), "another agent's stream is not touched")
			list, err := c.certs.ListRevocations(rpcCtx(t), &rdzvv1.ListRevocationsRequest{})
			require.NoError(t, err)
			require.Len(t, list.GetRevocations(), 1)
			ev := c.waitEvent("", controller.EventCertRevoked)
			require.Contains(t, ev.GetMessage(), "revoked by operator/test-operator")

			// A new certificate is issued after the revocation: with a new
			// serial, and after the identity's cut-off. Certificates are
			// stamped with whole seconds.
			time.Sleep(time.Second)
			require.NoError(t, register(t, c.dial(c.issue(pki.Identity{Role: pki.RoleAgent, Name: "node-a"})), "node-a"))
		})
	}
}

// TestRevocationSurvivesRestart: the deny-list is in etcd; a controller
// that takes the lead loads it and refuses the certificate from the start.
func TestRevocationSurvivesRestart(t *testing.T) {
	c := newCluster(t)
	viewer := c.issue(pki.Identity{Role: pki.RoleViewer, Name: "dash"})
	conn := c.dial(viewer)
	_, err := rdzvv1.NewJobServiceClient(conn).ListJobs(rpcCtx(t), &rdzvv1.ListJobsRequest{})
	require.NoError(t, err)
	_, err = c.certs.RevokeCertificate(rpcCtx(t), &rdzvv1.RevokeCertificateRequest{Target: &rdzvv1.RevokeCertificateRequest_Identity{Identity: "viewer/dash"}})
	require.NoError(t, err)
	_, err = rdzvv1.NewJobServiceClient(conn).ListJobs(rpcCtx(t), &rdzvv1.ListJobsRequest{})
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)

	c.stopController()
	c.startController()
	_, err = rdzvv1.NewJobServiceClient(c.dial(viewer)).ListJobs(rpcCtx(t), &rdzvv1.ListJobsRequest{})
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "certificate viewer/dash (serial ")
	list, err := c.certs.ListRevocations(rpcCtx(t), &rdzvv1.ListRevocationsRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetRevocations(), 1)
	require.Equal(t, "viewer/dash", list.GetRevocations()[0].GetIdentity())
}

// TestRevokeRefusesBadRequests: a request that names nothing valid, or a
// certificate that has expired already, changes nothing.
func TestRevokeRefusesBadRequests(t *testing.T) {
	c := newCluster(t)
	tests := []struct {
		name string
		req  *rdzvv1.RevokeCertificateRequest
		want string
	}{
		{"nothing", &rdzvv1.RevokeCertificateRequest{}, "serial, identity: give one"},
		{"bad role", &rdzvv1.RevokeCertificateRequest{Target: &rdzvv1.RevokeCertificateRequest_Identity{Identity: "root/x"}}, `role: want controller, agent, operator, viewer or relay, got "root"`},
		{"bad serial", &rdzvv1.RevokeCertificateRequest{Target: &rdzvv1.RevokeCertificateRequest_Serial{Serial: "g1"}}, "serial: want a certificate serial number in hex"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.certs.RevokeCertificate(rpcCtx(t), tt.req)
			require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
			require.Contains(t, status.Convert(err).Message(), tt.want)
		})
	}
	list, err := c.certs.ListRevocations(rpcCtx(t), &rdzvv1.ListRevocationsRequest{})
	require.NoError(t, err)
	require.Empty(t, list.GetRevocations())
	require.Empty(t, c.etcdKeys("/rdzv/v1/revoked/"))
}

// writeCAFile makes path hold the certificates of cas, as an operator
// replacing a CA does.
func writeCAFile(t *testing.T, path string, cas ...*pki.CA) {
	t.Helper()
	var data []byte
	for _, ca := range cas {
		dir := t.TempDir()
		require.NoError(t, ca.Save(dir, false))
		b, err := os.ReadFile(filepath.Join(dir, pki.CACertFile))
		require.NoError(t, err)
		data = append(data, b...)
	}
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, data, 0o644))
	require.NoError(t, os.Rename(tmp, path))
}

// TestCAReplacementDropsOldAgents replaces the CA as documented: old and
// new CA together, every certificate reissued, then the old CA removed.
// The agent still connected with a certificate of the old CA is dropped
// when the controller reloads the CA file without it.
func TestCAReplacementDropsOldAgents(t *testing.T) {
	c := newCluster(t, withReverify)
	old := c.connectFake("node-old")
	old.keepAlive()
	oldCA := c.ca
	newCA, err := pki.NewCA("test-ca-2", 365*24*time.Hour, time.Now())
	require.NoError(t, err)
	caFile := c.cfg.TLS.CA

	writeCAFile(t, caFile, oldCA, newCA)
	c.ca = newCA
	c.issue(pki.Identity{Role: pki.RoleController, Name: "controller"}, net.IPv4(127, 0, 0, 1))
	newFiles := c.issue(pki.Identity{Role: pki.RoleAgent, Name: "node-new"})
	// The controller takes both within a second or so.
	poll(t, func() bool { return register(t, c.dial(newFiles), "node-new") == nil },
		func() string { return "a certificate of the new CA is still refused" })
	fresh := c.connectFakeWith(newFiles, "node-new")
	fresh.keepAlive()
	old.heartbeat(1)
	require.False(t, old.closed(), "while both CAs are trusted, the old agent stays")

	writeCAFile(t, caFile, newCA)
	err = old.waitEnd()
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "certificate not signed by the cluster CA")
	fresh.heartbeat(1)
	require.False(t, fresh.closed())

	// Reconnecting with the old certificate is refused; the test's
	// operator client is of the old CA too, so look with a new one.
	ops := rdzvv1.NewNodeServiceClient(c.dial(c.issue(pki.Identity{Role: pki.RoleOperator, Name: "ops"})))
	poll(t, func() bool {
		resp, err := ops.ListNodes(rpcCtx(t), &rdzvv1.ListNodesRequest{})
		require.NoError(t, err)
		for _, n := range resp.GetNodes() {
			if n.GetInfo().GetName() == "node-old" {
				return n.GetState() == rdzvv1.NodeState_NODE_STATE_LOST
			}
		}
		return false
	}, func() string { return "node-old is not lost" })
}

// TestRefusedCAReload: a CA file that does not verify the controller's own
// certificate is refused loudly (an error log and a tls_reload_refused
// event); the previous CA stays in use, so agents of it stay connected and
// certificates of the new CA are not accepted.
func TestRefusedCAReload(t *testing.T) {
	// The controller gets its own copy of the CA file, so that the test's
	// clients keep trusting the controller's certificate.
	var ctlCA string
	c := newCluster(t, withReverify, func(cfg *controller.Config) {
		ctlCA = filepath.Join(t.TempDir(), "ca.crt")
		data, err := os.ReadFile(cfg.TLS.CA)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(ctlCA, data, 0o644))
		cfg.TLS.CA = ctlCA
	})
	a := c.connectFake("node-a")
	a.keepAlive()
	newCA, err := pki.NewCA("test-ca-2", 365*24*time.Hour, time.Now())
	require.NoError(t, err)

	writeCAFile(t, ctlCA, newCA)
	ev := c.waitEvent("", controller.EventTLSReloadRefused)
	require.Contains(t, ev.GetMessage(), "refused its changed TLS files and keeps its previous certificate and CA")
	require.Contains(t, ev.GetMessage(), "the CA file does not verify this daemon's own certificate")
	logged := c.logs.FilterMessage("tls reload refused: the new CA does not verify this daemon's own certificate; keeping the previous certificates and CA").All()
	require.NotEmpty(t, logged)
	require.Equal(t, zap.ErrorLevel, logged[0].Level)

	// Re-verification passes run every 200ms; the old CA is still the one
	// in use through several of them.
	for seq := uint64(1); seq <= 10; seq++ {
		time.Sleep(reverifyInterval)
		a.heartbeat(seq)
	}
	require.False(t, a.closed(), "the agent of the CA still in use stays connected")
	issued, err := newCA.Issue(pki.Request{Identity: pki.Identity{Role: pki.RoleAgent, Name: "node-b"}, ValidFor: time.Hour, Now: time.Now()})
	require.NoError(t, err)
	err = register(t, c.dialRaw(issued), "node-b")
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "certificate not signed by the cluster CA")
}
