// A controller that does not lead refuses calls in a form clients (agents,
// rdzvctl) follow to the leading replica. A controller that does not lead answers every call with
// codes.Unavailable carrying an ErrorInfo detail: the reason and, when it
// knows one, the leader's address to go to instead.
package wire

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Domain scopes the ErrorInfo reasons below.
const Domain = "rdzv"

// Reasons a controller gives for not serving a call.
const (
	// ReasonNotLeader: a follower (a controller that does not lead); the leader metadata says where to go.
	ReasonNotLeader = "NOT_LEADER"
	// ReasonNoLeader: no controller leads right now (an election or a new
	// leader's start-up is under way); retry shortly.
	ReasonNoLeader = "NO_LEADER"
	// ReasonEtcdUnavailable: etcd does not answer (no quorum?), so no
	// controller can lead or change anything; running jobs go on.
	ReasonEtcdUnavailable = "ETCD_UNAVAILABLE"
)

// leaderKey is the ErrorInfo metadata key of the leader's address.
const leaderKey = "leader"

// Error builds the status a controller answers with; leader may be empty.
func Error(reason, leader, msg string) error {
	st := status.New(codes.Unavailable, msg)
	info := &errdetails.ErrorInfo{Reason: reason, Domain: Domain}
	if leader != "" {
		info.Metadata = map[string]string{leaderKey: leader}
	}
	if withInfo, err := st.WithDetails(info); err == nil {
		st = withInfo
	}
	return st.Err()
}

// Parse reports the reason and leader hint of an error built by Error;
// ok is false for any other error (a transport failure, an answer).
func Parse(err error) (reason, leader string, ok bool) {
	st, isStatus := status.FromError(err)
	if !isStatus || st.Code() != codes.Unavailable {
		return "", "", false
	}
	for _, d := range st.Details() {
		if info, isInfo := d.(*errdetails.ErrorInfo); isInfo && info.GetDomain() == Domain {
			return info.GetReason(), info.GetMetadata()[leaderKey], true
		}
	}
	return "", "", false
}
