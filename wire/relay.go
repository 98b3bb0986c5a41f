package wire

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RelayedChainKey is the metadata key under which a relay (package relay)
// forwards the certificate chain of the agent whose stream it carries,
// leaf first, one DER certificate per value. The controller verifies the
// chain itself, against its CA and its deny-list, so a revoked or expired
// agent is refused through a relay as it is directly. The "-bin" suffix
// makes gRPC send the values base64-encoded.
const RelayedChainKey = "rdzv-relayed-chain-bin"

// MaxRelayedChain bounds the certificates a relay may forward: a leaf and
// intermediates. rdzv's own CA issues leaves directly, so two is plenty;
// the bound keeps a relay from making the controller parse a long list.
const MaxRelayedChain = 4

// ReasonRelayedCertRefused marks a refusal (Unauthenticated) of the agent
// certificate a relay forwarded, not of the relay's own. A client drops a
// connection whose certificate is refused, to handshake again with a
// renewed one; a relay must not, since its connection carries other
// agents. The relay passes the refusal on to the agent without the mark,
// and the agent drops its own connection.
const ReasonRelayedCertRefused = "RELAYED_CERT_REFUSED"

// RelayedRefusal is an Unauthenticated status marked as refusing a
// relayed agent's certificate.
func RelayedRefusal(msg string) error {
	st := status.New(codes.Unauthenticated, msg)
	if marked, err := st.WithDetails(&errdetails.ErrorInfo{Reason: ReasonRelayedCertRefused, Domain: Domain}); err == nil {
		st = marked
	}
	return st.Err()
}

// IsRelayedRefusal says whether err is a RelayedRefusal.
func IsRelayedRefusal(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unauthenticated {
		return false
	}
	for _, d := range st.Details() {
		if info, isInfo := d.(*errdetails.ErrorInfo); isInfo && info.GetDomain() == Domain && info.GetReason() == ReasonRelayedCertRefused {
			return true
		}
	}
	return false
}
