package pki

import (
	"fmt"
	"sync"
	"time"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// DenyList is a deny-list of client certificates in memory: entries by
// serial number, or by identity (every certificate of it issued before a
// time). The controller keeps the cluster's, as etcd holds it, and each
// relay a copy of the leader's, so that both refuse the same
// certificates. It has its own lock: it is consulted on every handshake
// and call.
type DenyList struct {
	mu         sync.RWMutex
	serials    map[string]*rdzvv1.Revocation
	identities map[Identity]*rdzvv1.Revocation
}

// NewDenyList is an empty deny-list.
func NewDenyList() *DenyList {
	return &DenyList{serials: map[string]*rdzvv1.Revocation{}, identities: map[Identity]*rdzvv1.Revocation{}}
}

// RevokedError refuses a certificate on the deny-list.
type RevokedError struct {
	ID     Identity
	Serial string
	Entry  *rdzvv1.Revocation
}

func (e *RevokedError) Error() string {
	msg := fmt.Sprintf("certificate %s (serial %s) revoked at %s by %s", e.ID, e.Serial,
		e.Entry.GetRevokedAt().AsTime().UTC().Format(time.RFC3339), e.Entry.GetRevokedBy())
	if e.Entry.GetIdentity() != "" {
		msg += fmt.Sprintf(" (every certificate of %s issued before %s; a newer one is accepted)", e.ID,
			e.Entry.GetIssuedBefore().AsTime().UTC().Format(time.RFC3339))
	}
	if e.Entry.GetReason() != "" {
		msg += ": " + e.Entry.GetReason()
	}
	return msg
}

// Check refuses, with a *RevokedError, the leaf certificate that v
// verified if the deny-list has it.
func (d *DenyList) Check(v ClientVerification) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if r := d.serials[v.Serial]; r != nil {
		return &RevokedError{ID: v.ID, Serial: v.Serial, Entry: r}
	}
	if r := d.identities[v.ID]; r != nil && v.IssuedAt.Before(r.GetIssuedBefore().AsTime()) {
		return &RevokedError{ID: v.ID, Serial: v.Serial, Entry: r}
	}
	return nil
}

// Add puts a valid entry on the list, replacing one of the same target.
func (d *DenyList) Add(r *rdzvv1.Revocation) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.addLocked(r)
}

func (d *DenyList) addLocked(r *rdzvv1.Revocation) {
	if s := r.GetSerial(); s != "" {
		d.serials[s] = r
		return
	}
	if id, err := ParseIdentity(r.GetIdentity()); err == nil {
		d.identities[id] = r
	}
}

// Replace makes the list hold entries only.
func (d *DenyList) Replace(entries []*rdzvv1.Revocation) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.serials, d.identities = map[string]*rdzvv1.Revocation{}, map[Identity]*rdzvv1.Revocation{}
	for _, r := range entries {
		d.addLocked(r)
	}
}

// Expire drops and returns the entries whose not_after has passed: every
// certificate they revoke has expired, and is refused as such.
func (d *DenyList) Expire(now time.Time) []*rdzvv1.Revocation {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []*rdzvv1.Revocation
	for s, r := range d.serials {
		if now.After(r.GetNotAfter().AsTime()) {
			delete(d.serials, s)
			out = append(out, r)
		}
	}
	for id, r := range d.identities {
		if now.After(r.GetNotAfter().AsTime()) {
			delete(d.identities, id)
			out = append(out, r)
		}
	}
	return out
}

// Entries is every entry, in no order.
func (d *DenyList) Entries() []*rdzvv1.Revocation {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := make([]*rdzvv1.Revocation, 0, len(d.serials)+len(d.identities))
	for _, r := range d.serials {
		out = append(out, r)
	}
	for _, r := range d.identities {
		out = append(out, r)
	}
	return out
}
