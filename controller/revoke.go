package controller

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/rdzv/rdzv/controller/store"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// Revocation: the controller keeps a deny-list of client certificates in
// etcd (store.RevokedPrefix), by serial number or by identity (every
// certificate of it issued before a time). Each leader loads it when it
// takes the lead and keeps it in memory; the authenticator refuses what it
// lists on every call, and open connections are verified again whenever
// it or the CA changes, and every tls.reverify_interval (clientConns). An
// entry is dropped once every certificate it revokes has expired, so the
// list stays as small as the certificates still alive.

// denyList is the deny-list in memory (pki.DenyList, which relays keep a
// copy of), listed oldest first.
type denyList struct{ *pki.DenyList }

func newDenyList() *denyList { return &denyList{pki.NewDenyList()} }

// list is every entry, oldest revocation first.
func (d *denyList) list() []*rdzvv1.Revocation {
	out := d.Entries()
	sort.Slice(out, func(i, j int) bool {
		ti, tj := out[i].GetRevokedAt().AsTime(), out[j].GetRevokedAt().AsTime()
		if !ti.Equal(tj) {
			return ti.Before(tj)
		}
		return store.RevocationKey(out[i]) < store.RevocationKey(out[j])
	})
	return out
}

// revocationTarget names what an entry revokes, for messages.
func revocationTarget(r *rdzvv1.Revocation) string {
	if s := r.GetSerial(); s != "" {
		return "certificate serial " + s
	}
	return "every certificate of " + r.GetIdentity() + " issued before " + r.GetIssuedBefore().AsTime().UTC().Format(time.RFC3339)
}

// validateRevocation checks an entry read back from etcd like the request
// that made it.
func validateRevocation(r *rdzvv1.Revocation) error {
	var errs []error
	switch {
	case r.GetSerial() != "":
		if s, err := pki.ParseSerial(r.GetSerial()); err != nil {
			errs = append(errs, err)
		} else if s != r.GetSerial() {
			errs = append(errs, fmt.Errorf("serial: want %q as stored, got %q", s, r.GetSerial()))
		}
	case r.GetIdentity() != "":
		if id, err := pki.ParseIdentity(r.GetIdentity()); err != nil {
			errs = append(errs, err)
		} else if id.String() != r.GetIdentity() {
			errs = append(errs, fmt.Errorf("identity: want %q as stored, got %q", id, r.GetIdentity()))
		}
		if err := r.GetIssuedBefore().CheckValid(); err != nil {
			errs = append(errs, fmt.Errorf("issued_before: %w", err))
		}
	default:
		errs = append(errs, errors.New("serial, identity: one is required"))
	}
	if err := r.GetNotAfter().CheckValid(); err != nil {
		errs = append(errs, fmt.Errorf("not_after: %w", err))
	}
	errs = append(errs, textErr("revoked_by", r.GetRevokedBy(), maxShortText), textErr("reason", r.GetReason(), maxReasonBytes))
	return errors.Join(errs...)
}

// validateRevokeCertificate checks an operator's revocation request.
func validateRevokeCertificate(r *rdzvv1.RevokeCertificateRequest) error {
	var errs []error
	switch {
	case r.GetSerial() != "":
		if _, err := pki.ParseSerial(r.GetSerial()); err != nil {
			errs = append(errs, err)
		}
		if r.NotAfter != nil {
			if err := r.GetNotAfter().CheckValid(); err != nil {
				errs = append(errs, fmt.Errorf("not_after: %w", err))
			}
		}
	case r.GetIdentity() != "":
		if _, err := pki.ParseIdentity(r.GetIdentity()); err != nil {
			errs = append(errs, err)
		}
		if r.NotAfter != nil {
			errs = append(errs, errors.New("not_after: only with a serial; an identity's entry is kept until the CA expires"))
		}
	default:
		errs = append(errs, errors.New("serial, identity: give one (a certificate serial in hex, or ROLE/NAME)"))
	}
	errs = append(errs, textErr("reason", r.GetReason(), maxReasonBytes))
	return errors.Join(errs...)
}

type certificateService struct {
	rdzvv1.UnimplementedCertificateServiceServer
	c *Controller
}

func (s *certificateService) RevokeCertificate(ctx context.Context, req *rdzvv1.RevokeCertificateRequest) (*rdzvv1.RevokeCertificateResponse, error) {
	r, err := s.c.revoke(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	return &rdzvv1.RevokeCertificateResponse{Revocation: r}, nil
}

func (s *certificateService) ListRevocations(context.Context, *rdzvv1.ListRevocationsRequest) (*rdzvv1.ListRevocationsResponse, error) {
	return &rdzvv1.ListRevocationsResponse{Revocations: s.c.guard.revoked.list()}, nil
}

// revoke puts a validated request on the deny-list and answers once it is
// durable; from then on the certificate is refused, and connections that
// present it are ended by the next re-verification, which it starts.
func (c *Controller) revoke(ctx context.Context, req *rdzvv1.RevokeCertificateRequest) (*rdzvv1.Revocation, error) {
	r, node, err := c.guard.revocation(ctx, req, c.clock.Now())
	if err != nil {
		return nil, err
	}
	target := revocationTarget(r)
	ev := newEvent(c.clock.Now(), "", node, 0, EventCertRevoked, "%s revoked by %s (reason: %q); open connections presenting it are closed", target, r.GetRevokedBy(), r.GetReason())
	reply := make(chan error, 1)
	c.mu.Lock()
	c.writes.queue(pendingWrite{ch: c.store.PutRevocation(r, ev), reply: reply, then: func() { c.guard.enforce(r) }})
	c.mu.Unlock()
	if err := await(ctx, reply); err != nil {
		return nil, fmt.Errorf("revoking %s: %w", target, err)
	}
	c.log.Info("certificate revoked", zap.String("target", target), zap.String("by", r.GetRevokedBy()), zap.String("reason", r.GetReason()),
		zap.Time("entry_until", r.GetNotAfter().AsTime()))
	return r, nil
}
