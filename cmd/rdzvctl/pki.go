package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/client"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

const (
	defaultPKIDir = "/etc/rdzv/pki"
	caValidFor    = 10 * 365 * 24 * time.Hour
	certValidFor  = 365 * 24 * time.Hour
)

// pkiCmd is `rdzvctl pki init|issue|show`, which work on files only and
// never talk to the controller, and `rdzvctl pki revoke|revocations`, which
// do: the controller keeps the deny-list and enforces it.
func (c *command) pkiCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pki",
		Short: "The cluster CA and certificates; the controller's deny-list",
		Long: `The cluster CA and its certificates (init, issue, show: files only, run on
the CA host), and the controller's deny-list of certificates (revoke,
revocations). See docs/install.md#certificates.`,
		Example: `  rdzvctl pki init --dir /etc/rdzv/pki
  rdzvctl pki issue agent gpu-01 --dir /etc/rdzv/pki
  rdzvctl pki revoke agent/gpu-01 --reason decommissioned`,
		Args: commandArgs,
		RunE: func(*cobra.Command, []string) error {
			return fmt.Errorf("%w: pki takes init, issue, show, revoke or revocations", errUsage)
		},
	}
	cmd.AddCommand(c.pkiInitCmd(), c.pkiIssueCmd(), c.pkiShowCmd(), c.pkiRevokeCmd(), c.pkiRevocationsCmd())
	return cmd
}

func (c *command) pkiInitCmd() *cobra.Command {
	var dir, name string
	var validFor time.Duration
	var force bool
	cmd := &cobra.Command{
		Use:     "init",
		Short:   "Create the cluster CA (ca.crt, ca.key)",
		Example: "  rdzvctl pki init --dir /etc/rdzv/pki",
		Args:    exactArgs(0, "pki init takes no arguments"),
		RunE: func(*cobra.Command, []string) error {
			ca, err := pki.NewCA(name, validFor, time.Now())
			if err != nil {
				return fmt.Errorf("creating the CA: %w", err)
			}
			if err := ca.Save(dir, force); err != nil {
				return fmt.Errorf("creating the CA: %w", err)
			}
			fmt.Fprintf(c.out, "created CA %q in %s (%s, %s; valid until %s)\n", name, dir, pki.CACertFile, pki.CAKeyFile, ca.Cert.NotAfter.UTC().Format(time.RFC3339))
			fmt.Fprintf(c.out, "keep %s private; issue certificates with: rdzvctl pki issue controller|agent|operator|viewer NAME --dir %s\n", pki.CAKeyFile, dir)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", defaultPKIDir, "directory for ca.crt and ca.key")
	cmd.Flags().StringVar(&name, "name", "rdzv cluster CA", "the CA's common name")
	cmd.Flags().DurationVar(&validFor, "valid-for", caValidFor, "how long the CA is valid")
	cmd.Flags().BoolVar(&force, "force", false, "replace an existing CA (every certificate it issued stops being trusted)")
	return cmd
}

func (c *command) pkiIssueCmd() *cobra.Command {
	var f issueFlags
	cmd := &cobra.Command{
		Use:   "issue ROLE NAME",
		Short: "Issue a certificate: controller, agent, operator, viewer or relay",
		Long: `Issue a certificate from the CA in --dir. ROLE is controller, agent (NAME
is the node's name), operator (full access), viewer (read-only) or relay
(rdzv-relay, which carries its agents' streams and speaks for them).
Controller and relay certificates name the addresses clients dial (--ip, --dns).`,
		Example: `  rdzvctl pki issue controller ctl-1 --ip 10.0.0.1 --dns ctl.example
  rdzvctl pki issue agent gpu-01
  rdzvctl pki issue relay rack-12 --ip 10.0.12.1
  rdzvctl pki issue operator alice --out ~/.rdzv/rdzvctl`,
		Args: exactArgs(2, "pki issue takes ROLE NAME (role: controller, agent, operator, viewer or relay)"),
		RunE: func(_ *cobra.Command, args []string) error { return c.pkiIssue(args, &f) },
	}
	fs := cmd.Flags()
	fs.StringVar(&f.dir, "dir", defaultPKIDir, "the CA directory (from pki init)")
	fs.StringVar(&f.dns, "dns", "", "controller and relay only: comma-separated DNS names clients dial (the NAME is always one)")
	fs.StringVar(&f.ips, "ip", "", "controller and relay only: comma-separated IP addresses clients dial")
	fs.DurationVar(&f.validFor, "valid-for", certValidFor, "how long the certificate is valid")
	fs.StringVar(&f.out, "out", "", "write OUT.crt and OUT.key (default DIR/ROLE-NAME)")
	fs.BoolVar(&f.force, "force", false, "replace existing files (rotation)")
	return cmd
}

type issueFlags struct {
	dir, dns, ips, out string
	validFor           time.Duration
	force              bool
}

func (c *command) pkiIssue(pos []string, f *issueFlags) error {
	role, err := pki.ParseRole(pos[0])
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	req := pki.Request{Identity: pki.Identity{Role: role, Name: pos[1]}, ValidFor: f.validFor, Now: time.Now()}
	if f.dns != "" {
		req.DNSNames = strings.Split(f.dns, ",")
	}
	if f.ips != "" {
		for _, s := range strings.Split(f.ips, ",") {
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
	ca, err := pki.LoadCA(f.dir)
	if err != nil {
		return fmt.Errorf("loading the CA from %s (create it with `rdzvctl pki init --dir %s`): %w", f.dir, f.dir, err)
	}
	issued, err := ca.Issue(req)
	if err != nil {
		return fmt.Errorf("issuing %s: %w", req.Identity, err)
	}
	prefix := f.out
	if prefix == "" {
		prefix = pki.DefaultOut(f.dir, req.Identity)
	}
	certPath, keyPath, err := issued.Save(prefix, f.force)
	if err != nil {
		return fmt.Errorf("issuing %s: %w", req.Identity, err)
	}
	fmt.Fprintf(c.out, "issued %s, valid until %s: %s %s\n", req.Identity, issued.Cert.NotAfter.UTC().Format(time.RFC3339), certPath, keyPath)
	return nil
}

func (c *command) pkiShowCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "show CERT...",
		Short:   "Print whom certificates speak for, their serials, validity and hosts",
		Example: "  rdzvctl pki show /etc/rdzv/pki/ca.crt ~/.rdzv/rdzvctl.crt",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return fmt.Errorf("%w: pki show takes certificate files", errUsage)
			}
			return nil
		},
		RunE: func(_ *cobra.Command, args []string) error { return c.pkiShow(args) },
	}
}

func (c *command) pkiShow(pos []string) error {
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
func (c *command) pkiRevokeCmd() *cobra.Command {
	var serial, certFile, reason string
	cmd := &cobra.Command{
		Use:   "revoke ROLE/NAME | --serial SERIAL | --cert FILE",
		Short: "Put certificates on the controller's deny-list",
		Long: `Put certificates on the controller's deny-list: refused from then on, open
connections closed. ROLE/NAME revokes every certificate of that identity
issued until now; --serial or --cert one certificate.`,
		Example: `  rdzvctl pki revoke agent/gpu-01 --reason decommissioned
  rdzvctl pki revoke --cert /etc/rdzv/pki/agent-gpu-02.crt`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.pkiRevoke(cmd.Context(), args, serial, certFile, reason)
		},
	}
	cmd.Flags().StringVar(&serial, "serial", "", "revoke one certificate by serial number (hex, as pki show prints it)")
	cmd.Flags().StringVar(&certFile, "cert", "", "revoke the certificate in this file (by its serial, kept on the deny-list until it expires)")
	cmd.Flags().StringVar(&reason, "reason", "", "why (shown in pki revocations and events)")
	return prints(cmd, allOutputs...)
}

func (c *command) pkiRevoke(ctx context.Context, pos []string, serial, certFile, reason string) error {
	o, err := c.format()
	if err != nil {
		return err
	}
	given := len(pos)
	for _, f := range []string{serial, certFile} {
		if f != "" {
			given++
		}
	}
	if given != 1 || len(pos) > 1 {
		return fmt.Errorf("%w: pki revoke takes one of ROLE/NAME (every certificate of that identity issued until now), --serial SERIAL or --cert FILE", errUsage)
	}
	req := &rdzvv1.RevokeCertificateRequest{Reason: reason}
	switch {
	case len(pos) == 1:
		id, err := pki.ParseIdentity(pos[0])
		if err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		req.Target = &rdzvv1.RevokeCertificateRequest_Identity{Identity: id.String()}
	case serial != "":
		s, err := pki.ParseSerial(serial)
		if err != nil {
			return fmt.Errorf("%w: --%v", errUsage, err)
		}
		req.Target = &rdzvv1.RevokeCertificateRequest_Serial{Serial: s}
	default:
		cert, err := pki.ReadCert(certFile)
		if err != nil {
			return err
		}
		req.Target = &rdzvv1.RevokeCertificateRequest_Serial{Serial: pki.Serial(cert)}
		req.NotAfter = timestamppb.New(cert.NotAfter)
	}
	resp, err := unary(ctx, c, "revoking", func(ctx context.Context, cl *client.Client) (*rdzvv1.RevokeCertificateResponse, error) {
		return cl.RevokeCertificate(ctx, req)
	})
	if err != nil {
		return err
	}
	r := resp.GetRevocation()
	what := "certificate serial " + r.GetSerial()
	if r.GetSerial() == "" {
		what = "every certificate of " + r.GetIdentity() + " issued until now"
	}
	return renderOne(c.out, o, r, func(w io.Writer, v view) {
		fmt.Fprintf(w, "revoked %s: refused from now on, open connections closed; on the deny-list until %s\n",
			what, r.GetNotAfter().AsTime().UTC().Format(time.RFC3339))
	}, what)
}

// pkiRevocations lists the controller's deny-list.
func (c *command) pkiRevocationsCmd() *cobra.Command {
	return prints(&cobra.Command{
		Use:     "revocations",
		Short:   "List the controller's deny-list",
		Example: "  rdzvctl pki revocations -o yaml",
		Args:    exactArgs(0, "pki revocations takes no arguments"),
		RunE:    func(cmd *cobra.Command, _ []string) error { return c.pkiRevocations(cmd.Context()) },
	}, allOutputs...)
}

func (c *command) pkiRevocations(ctx context.Context) error {
	o, err := c.format()
	if err != nil {
		return err
	}
	resp, err := unary(ctx, c, "listing revocations", func(ctx context.Context, cl *client.Client) (*rdzvv1.ListRevocationsResponse, error) {
		return cl.ListRevocations(ctx, &rdzvv1.ListRevocationsRequest{})
	})
	if err != nil {
		return err
	}
	return render(c.out, o, revocations, resp.GetRevocations())
}
