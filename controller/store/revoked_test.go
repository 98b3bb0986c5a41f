package store

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// TestRevocations: entries are stored under their serial or identity, read
// back by key, replaced by a later entry of the same target and deleted;
// an undecodable one is reported, not dropped silently.
func TestRevocations(t *testing.T) {
	s, cli := newStore(t)
	at := timestamppb.New(time.Unix(1700000000, 0))
	bySerial := &rdzvv1.Revocation{Target: &rdzvv1.Revocation_Serial{Serial: "1f2e"}, NotAfter: at, Reason: "laptop lost"}
	byID := &rdzvv1.Revocation{Target: &rdzvv1.Revocation_Identity{Identity: "agent/gpu-01"}, IssuedBefore: at, NotAfter: at}
	ev := &rdzvv1.Event{Kind: "certificate_revoked", Time: at}
	_, err := s.CommitAll(ctx(t), s.PutRevocation(bySerial, ev), s.PutRevocation(byID))
	require.NoError(t, err)

	got, dropped, err := s.Revocations(ctx(t))
	require.NoError(t, err)
	require.Empty(t, dropped)
	require.Len(t, got, 2)
	require.True(t, proto.Equal(bySerial, got["/rdzv/v1/revoked/serial/1f2e"]))
	require.True(t, proto.Equal(byID, got["/rdzv/v1/revoked/identity/agent/gpu-01"]))
	events, _, _, err := s.ListEvents(ctx(t), ClusterScope, EventPage{Newest: 10, Limit: 10, MaxBytes: 1 << 20})
	require.NoError(t, err)
	require.Equal(t, []string{"certificate_revoked"}, kinds(events), "the event is written with the entry")

	later := proto.Clone(byID).(*rdzvv1.Revocation)
	later.IssuedBefore = timestamppb.New(at.AsTime().Add(time.Hour))
	_, err = s.CommitAll(ctx(t), s.PutRevocation(later), s.DeleteRevocation(bySerial))
	require.NoError(t, err)
	_, err = cli.Put(ctx(t), RevokedSerialKey("abc"), "\xff\xff")
	require.NoError(t, err)

	got, dropped, err = s.Revocations(ctx(t))
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.True(t, proto.Equal(later, got[RevokedIdentityKey("agent/gpu-01")]), "revoking an identity again replaces its entry")
	require.Len(t, dropped, 1)
	require.Equal(t, RevokedSerialKey("abc"), dropped[0].Key)
}
