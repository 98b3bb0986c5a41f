package store

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// RevocationKey is where a deny-list entry is stored.
func RevocationKey(r *rdzvv1.Revocation) string {
	if r.GetSerial() != "" {
		return RevokedSerialKey(r.GetSerial())
	}
	return RevokedIdentityKey(r.GetIdentity())
}

// PutRevocation adds an entry to the deny-list, or replaces the entry of
// the same serial or identity.
func (s *Store) PutRevocation(r *rdzvv1.Revocation, events ...*rdzvv1.Event) *Change {
	key := RevocationKey(r)
	ch := newChange("revoking " + key[len(revokedPrefix):])
	ch.putMsg(key, r)
	s.events(ch, events)
	return ch
}

// DeleteRevocation drops an entry from the deny-list.
func (s *Store) DeleteRevocation(r *rdzvv1.Revocation) *Change {
	key := RevocationKey(r)
	ch := newChange("dropping expired revocation " + key[len(revokedPrefix):])
	ch.deleteRange(key, "")
	return ch
}

// Revocations reads the deny-list by key, and the entries that could not
// be decoded. Whether an entry is valid, and agrees with its key, is for
// the caller to check.
func (s *Store) Revocations(ctx context.Context) (map[string]*rdzvv1.Revocation, []Unreadable, error) {
	out := map[string]*rdzvv1.Revocation{}
	var dropped []Unreadable
	err := s.rangeAll(ctx, RevokedPrefix(), func(key string, value []byte, modRev int64) error {
		r := &rdzvv1.Revocation{}
		if err := proto.Unmarshal(value, r); err != nil {
			dropped = append(dropped, Unreadable{Key: key, ModRevision: modRev, Err: fmt.Errorf("decoding: %w", err)})
			return nil
		}
		out[key] = r
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("loading the certificate deny-list: %w", err)
	}
	return out, dropped, nil
}
