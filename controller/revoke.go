package controller

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

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
	return &rdzvv1.ListRevocationsResponse{Revocations: s.c.revoked.list()}, nil
}

// revoke puts a validated request on the deny-list and answers once it is
// durable; from then on the certificate is refused, and connections that
// present it are ended by the next re-verification, which it starts.
func (c *Controller) revoke(ctx context.Context, req *rdzvv1.RevokeCertificateRequest) (*rdzvv1.Revocation, error) {
	if c.tls == nil {
		return nil, status.Error(codes.FailedPrecondition, "this controller runs without TLS (insecure): there are no certificates to revoke")
	}
	now := c.clock.Now()
	by, _ := identityFrom(ctx)
	// No certificate that chains to the CA verifies after it expires.
	caNotAfter := c.tls.CANotAfter()
	r := &rdzvv1.Revocation{RevokedAt: timestamppb.New(now), RevokedBy: by.String(), Reason: req.GetReason(), NotAfter: timestamppb.New(caNotAfter)}
	node := ""
	if req.GetSerial() != "" {
		serial, err := pki.ParseSerial(req.GetSerial())
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		r.Target = &rdzvv1.Revocation_Serial{Serial: serial}
		if na := req.GetNotAfter(); na != nil && na.AsTime().Before(caNotAfter) {
			r.NotAfter = na
		}
	} else {
		id, err := pki.ParseIdentity(req.GetIdentity())
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		r.Target = &rdzvv1.Revocation_Identity{Identity: id.String()}
		r.IssuedBefore = timestamppb.New(now)
		if id.Role == pki.RoleAgent {
			node = id.Name
		}
	}
	if !r.GetNotAfter().AsTime().After(now) {
		return nil, status.Errorf(codes.InvalidArgument, "not_after: %s has passed: the certificate has expired and is refused already",
			r.GetNotAfter().AsTime().UTC().Format(time.RFC3339))
	}
	target := revocationTarget(r)
	ev := c.event("", node, 0, EventCertRevoked, "%s revoked by %s (reason: %q); open connections presenting it are closed", target, r.GetRevokedBy(), r.GetReason())
	reply := make(chan error, 1)
	c.mu.Lock()
	c.writes.queue(pendingWrite{ch: c.store.PutRevocation(r, ev), reply: reply, then: func() {
		c.revoked.Add(r)
		c.kickReverify()
	}})
	c.mu.Unlock()
	if err := await(ctx, reply); err != nil {
		return nil, fmt.Errorf("revoking %s: %w", target, err)
	}
	c.log.Info("certificate revoked", zap.String("target", target), zap.String("by", r.GetRevokedBy()), zap.String("reason", r.GetReason()),
		zap.Time("entry_until", r.GetNotAfter().AsTime()))
	return r, nil
}

// loadRevocations makes the deny-list what etcd holds, leaving out (and
// logging) entries that do not validate or do not match their key.
func (c *Controller) loadRevocations(entries map[string]*rdzvv1.Revocation, dropped []store.Unreadable) {
	for _, bad := range dropped {
		c.log.Error("invalid revocation record in etcd, not enforced", zap.String("key", bad.Key), zap.Error(bad.Err))
	}
	valid := make([]*rdzvv1.Revocation, 0, len(entries))
	for key, r := range entries {
		err := validateRevocation(r)
		if err == nil && store.RevocationKey(r) != key {
			err = fmt.Errorf("the record is for %s", store.RevocationKey(r))
		}
		if err != nil {
			c.log.Error("invalid revocation record in etcd, not enforced", zap.String("key", key), zap.Error(err))
			continue
		}
		valid = append(valid, r)
	}
	c.revoked.Replace(valid)
	if len(valid) > 0 {
		c.log.Info("certificate deny-list loaded", zap.Int("entries", len(valid)))
	}
}

// expireRevocations deletes the entries whose certificates have all
// expired. Callers hold c.mu.
func (c *Controller) expireRevocations(now time.Time) {
	for _, r := range c.revoked.Expire(now) {
		c.writes.persist(c.store.DeleteRevocation(r), nil)
		c.log.Info("revocation dropped: every certificate it revokes has expired", zap.String("target", revocationTarget(r)),
			zap.Time("not_after", r.GetNotAfter().AsTime()))
	}
}

func (c *Controller) kickReverify() {
	select {
	case c.reverifyKick <- struct{}{}:
	default:
	}
}

// tlsReloaded is the TLS reloader's hook: a new CA or deny-list is checked
// against every open connection at once, and a reload refused because the
// new CA does not verify the controller's own certificate is reported.
// It runs under the reloader's lock: it only queues.
func (c *Controller) tlsReloaded(err error) {
	switch {
	case errors.Is(err, pki.ErrOwnCertUntrusted):
		c.reloadRefused.Store(&err)
	case err != nil:
		// A rotation caught halfway (a certificate whose key has not
		// landed yet): the reloader logs it, the next change settles it.
		return
	}
	c.kickReverify()
}

// reverifyLoop verifies the certificate of every open connection again
// while this controller leads (only the leader has streams): whenever the
// deny-list or the CA changes, and every tls.reverify_interval, which also
// makes the reloader look at the files when no one connects.
func (c *Controller) reverifyLoop(ctx context.Context) {
	if c.auth == nil {
		return // insecure: no certificates
	}
	ticker := c.clock.NewTicker(c.cfg.TLS.ReverifyInterval.Duration)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.Chan():
			c.tls.Refresh()
			// A reload that Refresh triggered is checked by this pass.
			select {
			case <-c.reverifyKick:
			default:
			}
		case <-c.reverifyKick:
		}
		c.reportRefusedReload()
		c.conns.reverify(c.auth.verify)
	}
}

// reportRefusedReload records a refused TLS reload as a cluster event.
func (c *Controller) reportRefusedReload() {
	p := c.reloadRefused.Swap(nil)
	if p == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ev := c.event("", "", 0, EventTLSReloadRefused,
		"controller %s refused its changed TLS files and keeps its previous certificate and CA: %v. Replace a CA in steps (docs/operating.md#replacing-the-ca): old and new CA together in %s, every certificate reissued from the new CA, then the old CA removed",
		c.cfg.Advertised(), *p, c.cfg.TLS.CA)
	c.writes.persist(c.store.AppendEvent(ev), nil)
}
