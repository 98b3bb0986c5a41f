package controller

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// TestEveryMethodHasRoles keeps a new RPC from going unnoticed: unlisted
// methods are denied to everyone, which is safe but surely not meant.
func TestEveryMethodHasRoles(t *testing.T) {
	var methods []string
	for _, sd := range []grpc.ServiceDesc{rdzvv1.AgentService_ServiceDesc, rdzvv1.RelayService_ServiceDesc, rdzvv1.JobService_ServiceDesc, rdzvv1.NodeService_ServiceDesc, rdzvv1.CertificateService_ServiceDesc,
		rdzvv1.ServerService_ServiceDesc} {
		for _, m := range sd.Methods {
			methods = append(methods, "/"+sd.ServiceName+"/"+m.MethodName)
		}
		for _, s := range sd.Streams {
			methods = append(methods, "/"+sd.ServiceName+"/"+s.StreamName)
		}
	}
	for _, m := range methods {
		require.NotEmpty(t, methodRoles[m], "method %s has no roles in methodRoles", m)
	}
	require.Len(t, methodRoles, len(methods), "methodRoles lists a method no service has")
}

func TestAuthorize(t *testing.T) {
	const (
		start  = rdzvv1.JobService_StartJob_FullMethodName
		list   = rdzvv1.JobService_ListJobs_FullMethodName
		cordon = rdzvv1.NodeService_CordonNode_FullMethodName
		nodes  = rdzvv1.NodeService_ListNodes_FullMethodName
		logs   = rdzvv1.JobService_StreamLogs_FullMethodName
		agent  = rdzvv1.AgentService_Connect_FullMethodName

		revoke      = rdzvv1.CertificateService_RevokeCertificate_FullMethodName
		revocations = rdzvv1.CertificateService_ListRevocations_FullMethodName
	)
	tests := []struct {
		role    pki.Role
		method  string
		wantErr string // empty: allowed
	}{
		{pki.RoleOperator, start, ""},
		{pki.RoleOperator, cordon, ""},
		{pki.RoleOperator, list, ""},
		{pki.RoleOperator, agent, "operator/x (role operator) may not call /rdzv.v1.AgentService/Connect: it needs a certificate of role agent"},
		{pki.RoleViewer, list, ""},
		{pki.RoleViewer, nodes, ""},
		{pki.RoleViewer, logs, ""},
		{pki.RoleViewer, start, "viewer/x (role viewer) may not call /rdzv.v1.JobService/StartJob: it needs a certificate of role operator"},
		{pki.RoleViewer, cordon, "it needs a certificate of role operator"},
		{pki.RoleAgent, agent, ""},
		{pki.RoleAgent, list, "it needs a certificate of role operator or viewer"},
		{pki.RoleAgent, start, "agent/x (role agent) may not call"},
		{pki.RoleController, list, "controller/x (role controller) may not call"},
		{pki.RoleController, agent, "may not call"},
		{pki.RoleOperator, revoke, ""},
		{pki.RoleViewer, revoke, "viewer/x (role viewer) may not call /rdzv.v1.CertificateService/RevokeCertificate: it needs a certificate of role operator"},
		{pki.RoleAgent, revoke, "it needs a certificate of role operator"},
		{pki.RoleViewer, revocations, "it needs a certificate of role operator"},
		{pki.RoleOperator, revocations, ""},
		{pki.RoleRelay, revocations, ""},
		{pki.RoleRelay, revoke, "it needs a certificate of role operator"},
		{pki.RoleOperator, "/rdzv.v1.JobService/DeleteEverything", "no role may call it"},
		{pki.RoleOperator, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", "no role may call it"},
	}
	for _, tt := range tests {
		t.Run(string(tt.role)+tt.method, func(t *testing.T) {
			err := authorize(pki.Identity{Role: tt.role, Name: "x"}, tt.method)
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.Equal(t, codes.PermissionDenied, status.Code(err))
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

// TestDERChain: a relayed agent's chain, kept as DER, parses back to the
// same certificates when it must be verified in full; DER that no longer
// parses gives no chain, which verification refuses (pki.ErrNoCertificate).
func TestDERChain(t *testing.T) {
	ca := testCA(t)
	leaf := issueAt(t, ca, "agent/gpu-01", revokeNow)
	certs := derChain([][]byte{leaf.Raw, ca.Cert.Raw})()
	require.Len(t, certs, 2)
	require.True(t, certs[0].Equal(leaf))
	require.True(t, certs[1].Equal(ca.Cert))
	require.Nil(t, derChain([][]byte{leaf.Raw, []byte("junk")})())
}
