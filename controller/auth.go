package controller

import (
	"context"
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

var (
	readers   = []pki.Role{pki.RoleOperator, pki.RoleViewer}
	operators = []pki.Role{pki.RoleOperator}
	agents    = []pki.Role{pki.RoleAgent}
)

// methodRoles is who may call each method. A method missing here is
// refused to everyone, so a new RPC is closed until it is listed; only
// publicMethod's (grpc.health.v1) are answered without a certificate.
var methodRoles = map[string][]pki.Role{
	rdzvv1.AgentService_Connect_FullMethodName: agents,
	rdzvv1.RelayService_Carry_FullMethodName:   {pki.RoleRelay},

	rdzvv1.JobService_GetJob_FullMethodName:      readers,
	rdzvv1.JobService_ListJobs_FullMethodName:    readers,
	rdzvv1.JobService_ListEvents_FullMethodName:  readers,
	rdzvv1.JobService_StreamLogs_FullMethodName:  readers,
	rdzvv1.JobService_WatchEvents_FullMethodName: readers,
	rdzvv1.JobService_StartJob_FullMethodName:    operators,
	rdzvv1.JobService_StopJob_FullMethodName:     operators,
	rdzvv1.JobService_DeleteJob_FullMethodName:   operators,

	rdzvv1.NodeService_ListNodes_FullMethodName:      readers,
	rdzvv1.NodeService_SummarizeNodes_FullMethodName: readers,
	rdzvv1.NodeService_CordonNode_FullMethodName:     operators,
	rdzvv1.NodeService_UncordonNode_FullMethodName:   operators,
	rdzvv1.NodeService_DrainNode_FullMethodName:      operators,

	rdzvv1.ServerService_GetServerInfo_FullMethodName: readers,

	rdzvv1.CertificateService_RevokeCertificate_FullMethodName: operators,
	// Relays refuse what the deny-list holds at their agents' handshake.
	rdzvv1.CertificateService_ListRevocations_FullMethodName: {pki.RoleOperator, pki.RoleRelay},
}

// authorize says whether id may call method.
func authorize(id pki.Identity, method string) error {
	roles := methodRoles[method]
	if slices.Contains(roles, id.Role) {
		return nil
	}
	need := "no role may call it"
	if len(roles) > 0 {
		names := make([]string, len(roles))
		for i, r := range roles {
			names[i] = string(r)
		}
		need = "it needs a certificate of role " + strings.Join(names, " or ")
	}
	return status.Errorf(codes.PermissionDenied, "%s (role %s) may not call %s: %s", id, id.Role, method, need)
}

// peerChain is the certificate chain the caller presented, leaf first;
// nil without one.
func peerChain(ctx context.Context) []*x509.Certificate {
	p, _ := peer.FromContext(ctx)
	if p == nil {
		return nil
	}
	switch info := p.AuthInfo.(type) {
	case connInfo:
		return info.State.PeerCertificates
	case credentials.TLSInfo:
		return info.State.PeerCertificates
	}
	return nil
}

// clientCertNotAfter is when the caller's certificate expires; zero
// without one.
func clientCertNotAfter(ctx context.Context) time.Time {
	if chain := peerChain(ctx); len(chain) > 0 {
		return chain[0].NotAfter
	}
	return time.Time{}
}

type identityKey struct{}

// identityFrom is the verified identity of the caller, set by the
// authenticator on every call of a TLS controller.
func identityFrom(ctx context.Context) (pki.Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(pki.Identity)
	return id, ok
}

// authenticator verifies the caller's certificate on every call and
// authorizes the call by role. Only connections whose certificate verified
// as their handshake ended reach these calls (preauth.go); verifying again
// applies revocations, CA reloads and expiry since.
type authenticator struct {
	tls     *pki.Reloader
	revoked *denyList
	log     *zap.Logger
}

// verify accepts a client certificate chain that verifies against the CA
// as loaded now and is not on the deny-list, and returns its identity.
func (a *authenticator) verify(chain pki.Chain, prev pki.ClientVerification) (pki.ClientVerification, error) {
	v, err := a.tls.VerifyClientAgain(chain, prev)
	if err != nil {
		return pki.ClientVerification{}, err
	}
	if err := a.revoked.Check(v); err != nil {
		return pki.ClientVerification{}, err
	}
	return v, nil
}

func (a *authenticator) check(ctx context.Context, method string) (context.Context, error) {
	if publicMethod(method) {
		return ctx, nil
	}
	addr := ""
	if p, _ := peer.FromContext(ctx); p != nil && p.Addr != nil {
		addr = p.Addr.String()
	}
	cc := trackedConn(ctx)
	var prev pki.ClientVerification
	if cc != nil {
		prev = cc.lastVerification()
	}
	v, err := a.verify(pki.ChainOf(peerChain(ctx)), prev)
	if err != nil {
		a.log.Warn("unauthenticated call refused", zap.String("method", method), zap.String("peer", addr), zap.Error(err))
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	id := v.ID
	if cc != nil {
		cc.accepted(v)
	}
	if err := authorize(id, method); err != nil {
		a.log.Warn("unauthorized call refused", zap.String("method", method), zap.String("peer", addr), zap.Stringer("identity", id))
		return nil, err
	}
	return context.WithValue(ctx, identityKey{}, id), nil
}

// relayed is an agent stream that a relay carries: the agent's certificate
// chain, as the relay forwarded it, and its verification here. The chain is
// kept as DER and parsed again only if it must be verified in full (the CA
// changed, or a certificate's validity ended: pki.VerifyClientAgain):
// parsed, the chains of thousands of relayed agents would be a large part
// of the controller's heap.
type relayed struct {
	relay        pki.Identity
	ders         [][]byte
	leaf         leafInfo
	verification pki.ClientVerification
}

// derChain is the Chain of certificates kept as DER. They parsed when the
// stream opened; if one no longer did, the chain would be empty, which
// fails verification.
func derChain(ders [][]byte) pki.Chain {
	return func() []*x509.Certificate {
		certs := make([]*x509.Certificate, len(ders))
		for i, der := range ders {
			cert, err := x509.ParseCertificate(der)
			if err != nil {
				return nil
			}
			certs[i] = cert
		}
		return certs
	}
}

// relayedAgent verifies the agent certificate chain (DER, leaf first) that
// relay forwarded to open a carried stream (RelayService.Carry). The relay
// verified it when the agent connected; verifying it here too applies the
// controller's CA and deny-list as they are now, so a relay cannot carry a
// revoked or expired agent, nor vouch for anyone but an agent.
func (a *authenticator) relayedAgent(relay pki.Identity, ders [][]byte) (*relayed, error) {
	if len(ders) == 0 || len(ders) > wire.MaxRelayedChain {
		return nil, status.Errorf(codes.PermissionDenied, "%s may open a stream only for an agent: its certificate_chain must hold 1 to %d certificates, got %d",
			relay, wire.MaxRelayedChain, len(ders))
	}
	chain := make([]*x509.Certificate, len(ders))
	for i, der := range ders {
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, status.Errorf(codes.Unauthenticated, "relayed certificate %d of %s: %v", i, relay, err)
		}
		chain[i] = cert
	}
	v, err := a.verify(pki.ChainOf(chain), pki.ClientVerification{})
	if err != nil {
		return nil, status.Errorf(codes.Unauthenticated, "agent certificate relayed by %s: %v", relay, err)
	}
	if v.ID.Role != pki.RoleAgent {
		return nil, status.Errorf(codes.PermissionDenied, "%s relayed the certificate of %s: a relay carries agents only", relay, v.ID)
	}
	return &relayed{relay: relay, ders: ders, leaf: leafOf(chain[0]), verification: v}, nil
}

func (a *authenticator) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, err := a.check(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// stream authenticates a stream when it opens, and ends it with
// Unauthenticated when its connection's certificate is refused later
// (expired, revoked, CA replaced; see clientConns).
func (a *authenticator) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, err := a.check(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	ctx, done, err := trackStream(ctx)
	if err != nil {
		return err
	}
	defer done()
	err = handler(srv, &identityStream{ServerStream: ss, ctx: ctx})
	if refused := streamRefused(ctx); refused != nil {
		return refused
	}
	return err
}

// identityStream carries the caller's identity in the stream's context.
type identityStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *identityStream) Context() context.Context { return s.ctx }

// nodeIdentity refuses id, an agent's verified identity (directly or
// through a relay), registering as node unless its certificate names it.
func nodeIdentity(id pki.Identity, node string) error {
	if id.Role != pki.RoleAgent || id.Name != node {
		return status.Errorf(codes.PermissionDenied, "%s may not register node %q: an agent registers only as the node named in its certificate", id, node)
	}
	return nil
}

// wantController accepts only a controller certificate as the
// controller's own.
func wantController(id pki.Identity) error {
	if id.Role != pki.RoleController {
		return fmt.Errorf("is the certificate of %s; the controller needs one of role controller (rdzvctl pki issue controller NAME)", id)
	}
	return nil
}
