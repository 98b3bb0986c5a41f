package sim

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"runtime"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/rdzv/rdzv/client"
	"github.com/rdzv/rdzv/pki"
)

// ControllerName is the controller's certificate name.
const ControllerName = "rdzv-controller"

// Certs is a cluster CA and its certificates, kept in a directory that may
// serve as a cache across runs: 10,000 agent certificates take seconds to
// issue.
type Certs struct {
	ca       *pki.CA
	Dir      string
	Roots    *tls.Config // verifies the controller (client side)
	Operator tls.Certificate
	Agents   []tls.Certificate // agent i's is Agents[i], for node Name(i)
}

// LoadCerts loads or issues the CA, the controller's and an operator's
// certificate and n agent certificates (Name(0)...), as `rdzvctl pki` lays
// them out, so that the controller reads them with its usual flags
// (testpki.DaemonArgs(dir, "controller", ControllerName)).
func LoadCerts(dir string, n int) (*Certs, error) {
	now := time.Now()
	ca, err := pki.LoadCA(dir)
	if err != nil || ca.Cert.NotAfter.Before(now.Add(100*24*time.Hour)) {
		// A new CA makes every cached certificate useless.
		if err := os.RemoveAll(dir); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		if ca, err = pki.NewCA("rdzv-sim", 365*24*time.Hour, now); err != nil {
			return nil, err
		}
		if err := ca.Save(dir, false); err != nil {
			return nil, err
		}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	c := &Certs{ca: ca, Dir: dir, Roots: &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool}, Agents: make([]tls.Certificate, n)}
	if _, err := issue(ca, pki.Request{Identity: pki.Identity{Role: pki.RoleController, Name: ControllerName}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}, dir, now); err != nil {
		return nil, err
	}
	if c.Operator, err = issue(ca, pki.Request{Identity: pki.Identity{Role: pki.RoleOperator, Name: "sim"}}, dir, now); err != nil {
		return nil, err
	}
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i := range n {
		g.Go(func() (err error) {
			c.Agents[i], err = issue(ca, pki.Request{Identity: pki.Identity{Role: pki.RoleAgent, Name: Name(i)}}, dir, now)
			return err
		})
	}
	return c, g.Wait()
}

// issue loads the certificate for req from dir, or issues and saves it
// when it is missing or expires within a day.
func issue(ca *pki.CA, req pki.Request, dir string, now time.Time) (tls.Certificate, error) {
	prefix := pki.DefaultOut(dir, req.Identity)
	if cert, err := tls.LoadX509KeyPair(prefix+".crt", prefix+".key"); err == nil && cert.Leaf.NotAfter.After(now.Add(24*time.Hour)) {
		return cert, nil
	}
	req.Now, req.ValidFor = now, 90*24*time.Hour
	is, err := ca.Issue(req)
	if err != nil {
		return tls.Certificate{}, err
	}
	if _, _, err := is.Save(prefix, true); err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{is.Cert.Raw}, PrivateKey: is.Key, Leaf: is.Cert}, nil
}

// OperatorClient is an API client with the operator's certificate.
func (c *Certs) OperatorClient(addr string) (*client.Client, error) {
	tc := c.Roots.Clone()
	tc.Certificates = append(tc.Certificates, c.Operator)
	cc := client.DefaultConfig()
	cc.Endpoints, cc.TLS = []string{addr}, &client.TLS{Config: tc}
	return client.New(cc)
}

// RelayName is relay i's certificate name.
func RelayName(i int) string { return fmt.Sprintf("relay-%03d", i) }

// IssueRelay loads or issues relay i's certificate (RelayName, for
// 127.0.0.1), where rdzv-relay reads it with its usual flags
// (testpki.DaemonArgs(dir, "relay", RelayName(i))).
func (c *Certs) IssueRelay(i int) error {
	_, err := issue(c.ca, pki.Request{Identity: pki.Identity{Role: pki.RoleRelay, Name: RelayName(i)}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}, c.Dir, time.Now())
	return err
}
