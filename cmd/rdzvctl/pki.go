package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

const (
	defaultPKIDir = "/etc/rdzv/pki"
	caValidFor    = 10 * 365 * 24 * time.Hour
	certValidFor  = 365 * 24 * time.Hour
)

// pki runs `rdzvctl pki init|issue|show`, which work on files only and
// never talk to the controller, and `rdzvctl pki revoke|revocations`, which
// do: the controller keeps the deny-list and enforces it.
func (c *command) pki(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: pki takes init, issue, show, revoke or revocations", errUsage)
	}
	switch args[0] {
	case "init":
		return c.pkiInit(args[1:])
	case "issue":
		return c.pkiIssue(args[1:])
	case "show":
		return c.pkiShow(args[1:])
	case "revoke":
		return c.pkiRevoke(ctx, args[1:])
	case "revocations":
		return c.pkiRevocations(ctx, args[1:])
	}
	return fmt.Errorf("%w: unknown pki command %q (want init, issue, show, revoke or revocations)", errUsage, args[0])
}

func (c *command) pkiInit(args []string) error {
	fs := c.flags("pki init")
	dir := fs.String("dir", defaultPKIDir, "directory for ca.crt and ca.key")
	name := fs.String("name", "rdzv cluster CA", "the CA's common name")
	validFor := fs.Duration("valid-for", caValidFor, "how long the CA is valid")
	force := fs.Bool("force", false, "replace an existing CA (every certificate it issued stops being trusted)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return fmt.Errorf("%w: pki init takes no arguments", errUsage)
	}
	ca, err := pki.NewCA(*name, *validFor, time.Now())
	if err != nil {
		return fmt.Errorf("creating the CA: %w", err)
	}
	if err := ca.Save(*dir, *force); err != nil {
		return fmt.Errorf("creating the CA: %w", err)
	}
	fmt.Fprintf(c.out, "created CA %q in %s (%s, %s; valid until %s)\n", *name, *dir, pki.CACertFile, pki.CAKeyFile, ca.Cert.NotAfter.UTC().Format(time.RFC3339))
	fmt.Fprintf(c.out, "keep %s private; issue certificates with: rdzvctl pki issue controller|agent|operator|viewer NAME --dir %s\n", pki.CAKeyFile, *dir)
	return nil
}

func (c *command) pkiIssue(args []string) error {
	fs := c.flags("pki issue")
	dir := fs.String("dir", defaultPKIDir, "the CA directory (from pki init)")
	dns := fs.String("dns", "", "controller only: comma-separated DNS names clients dial (the NAME is always one)")
	ips := fs.String("ip", "", "controller only: comma-separated IP addresses clients dial")
	validFor := fs.Duration("valid-for", certValidFor, "how long the certificate is valid")
	out := fs.String("out", "", "write OUT.crt and OUT.key (default DIR/ROLE-NAME)")
	force := fs.Bool("force", false, "replace existing files (rotation)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return fmt.Errorf("%w: pki issue takes ROLE NAME (role: controller, agent, operator or viewer)", errUsage)
	}
	role, err := pki.ParseRole(pos[0])
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	req := pki.Request{Identity: pki.Identity{Role: role, Name: pos[1]}, ValidFor: *validFor, Now: time.Now()}
	if *dns != "" {
		req.DNSNames = strings.Split(*dns, ",")
	}
	if *ips != "" {
		for _, s := range strings.Split(*ips, ",") {
			ip := net.ParseIP(s)
			if ip == nil {
				return fmt.Errorf("%w: --ip: %q is not an IP address", errUsage, s)
			}
			req.IPs = append(req.IPs, ip)
		}
	}
	// Checked before the CA is read, so a typo is reported as such.
	if err := req.Identity.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	ca, err := pki.LoadCA(*dir)
	if err != nil {
		return fmt.Errorf("loading the CA from %s (create it with `rdzvctl pki init --dir %s`): %w", *dir, *dir, err)
	}
	issued, err := ca.Issue(req)
	if err != nil {
		return fmt.Errorf("issuing %s: %w", req.Identity, err)
	}
	prefix := *out
	if prefix == "" {
		prefix = pki.DefaultOut(*dir, req.Identity)
	}
	certPath, keyPath, err := issued.Save(prefix, *force)
	if err != nil {
		return fmt.Errorf("issuing %s: %w", req.Identity, err)
	}
	fmt.Fprintf(c.out, "issued %s, valid until %s: %s %s\n", req.Identity, issued.Cert.NotAfter.UTC().Format(time.RFC3339), certPath, keyPath)
	return nil
}

func (c *command) pkiShow(args []string) error {
	pos, err := parse(c.flags("pki show"), args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return fmt.Errorf("%w: pki show takes certificate files", errUsage)
	}
	for _, path := range pos {
		cert, err := pki.ReadCert(path)
		if err != nil {
			return err
		}
		who := "CA"
		if !cert.IsCA {
			id, err := pki.IdentityOf(cert)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			who = id.String()
		}
		var hosts []string
		hosts = append(hosts, cert.DNSNames...)
		for _, ip := range cert.IPAddresses {
			hosts = append(hosts, ip.String())
		}
		fmt.Fprintf(c.out, "%s: %s, serial %x, valid %s to %s", path, who, cert.SerialNumber, cert.NotBefore.UTC().Format(time.RFC3339), cert.NotAfter.UTC().Format(time.RFC3339))
		if len(hosts) > 0 {
			fmt.Fprintf(c.out, ", hosts %s", strings.Join(hosts, ","))
		}
		fmt.Fprintln(c.out)
	}
	return nil
}

// pkiRevoke puts certificates on the controller's deny-list: one
// certificate by serial (or its file), or every certificate of an
// identity issued until now.
func (c *command) pkiRevoke(ctx context.Context, args []string) error {
	fs := c.flags("pki revoke")
	serial := fs.String("serial", "", "revoke one certificate by serial number (hex, as pki show prints it)")
	certFile := fs.String("cert", "", "revoke the certificate in this file (by its serial, kept on the deny-list until it expires)")
	reason := fs.String("reason", "", "why (shown in pki revocations and events)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	given := len(pos)
	for _, f := range []string{*serial, *certFile} {
		if f != "" {
			given++
		}
	}
	if given != 1 || len(pos) > 1 {
		return fmt.Errorf("%w: pki revoke takes one of ROLE/NAME (every certificate of that identity issued until now), --serial SERIAL or --cert FILE", errUsage)
	}
	req := &rdzvv1.RevokeCertificateRequest{Reason: *reason}
	switch {
	case len(pos) == 1:
		id, err := pki.ParseIdentity(pos[0])
		if err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		req.Target = &rdzvv1.RevokeCertificateRequest_Identity{Identity: id.String()}
	case *serial != "":
		s, err := pki.ParseSerial(*serial)
		if err != nil {
			return fmt.Errorf("%w: --%v", errUsage, err)
		}
		req.Target = &rdzvv1.RevokeCertificateRequest_Serial{Serial: s}
	default:
		cert, err := pki.ReadCert(*certFile)
		if err != nil {
			return err
		}
		req.Target = &rdzvv1.RevokeCertificateRequest_Serial{Serial: pki.Serial(cert)}
		req.NotAfter = timestamppb.New(cert.NotAfter)
	}
	client, err := c.dial()
	if err != nil {
		return err
	}
	cctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := client.RevokeCertificate(cctx, req)
	if err != nil {
		return c.rpcErr("revoking", err)
	}
	r := resp.GetRevocation()
	if c.output == "json" {
		return c.printJSON(r)
	}
	what := "certificate serial " + r.GetSerial()
	if r.GetSerial() == "" {
		what = "every certificate of " + r.GetIdentity() + " issued until now"
	}
	fmt.Fprintf(c.out, "revoked %s: refused from now on, open connections closed; on the deny-list until %s\n",
		what, r.GetNotAfter().AsTime().UTC().Format(time.RFC3339))
	return nil
}

// pkiRevocations lists the controller's deny-list.
func (c *command) pkiRevocations(ctx context.Context, args []string) error {
	pos, err := parse(c.flags("pki revocations"), args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return fmt.Errorf("%w: pki revocations takes no arguments", errUsage)
	}
	client, err := c.dial()
	if err != nil {
		return err
	}
	cctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := client.ListRevocations(cctx, &rdzvv1.ListRevocationsRequest{})
	if err != nil {
		return c.rpcErr("listing revocations", err)
	}
	if c.output == "json" {
		return c.printJSON(resp)
	}
	printRevocations(c.out, resp.GetRevocations())
	return nil
}
