package pki_test

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/rdzv/rdzv/pki"
)

// writeSet writes an issued certificate and ca's certificate to dir as
// the files a daemon is configured with.
func writeSet(t *testing.T, dir string, ca *pki.CA, is *pki.Issued) pki.Files {
	t.Helper()
	_, _, err := is.Save(filepath.Join(dir, "node"), true)
	require.NoError(t, err)
	caDir := t.TempDir()
	require.NoError(t, ca.Save(caDir, false))
	data, err := os.ReadFile(filepath.Join(caDir, pki.CACertFile))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, pki.CACertFile), data, 0o644))
	return pki.Files{Cert: filepath.Join(dir, "node.crt"), Key: filepath.Join(dir, "node.key"), CA: filepath.Join(dir, pki.CACertFile)}
}

// serving is the certificate a server built on r presents now.
func serving(t *testing.T, r *pki.Reloader) *x509.Certificate {
	t.Helper()
	c, err := r.ServerConfig(nil).GetCertificate(nil)
	require.NoError(t, err)
	return c.Leaf
}

func TestReloaderPicksUpRotation(t *testing.T) {
	dir := t.TempDir()
	clock := clockwork.NewFakeClockAt(now)
	ca := newCA(t)
	first := issue(t, ca, pki.RoleController, "ctl")
	files := writeSet(t, dir, ca, first)
	r, err := pki.NewReloader(files, nil, zaptest.NewLogger(t), pki.WithClock(clock))
	require.NoError(t, err)
	require.Equal(t, pki.Identity{Role: pki.RoleController, Name: "ctl"}, r.Identity())
	require.True(t, serving(t, r).Equal(first.Cert))

	second := issue(t, ca, pki.RoleController, "ctl")
	_, _, err = second.Save(filepath.Join(dir, "node"), true)
	require.NoError(t, err)
	require.True(t, serving(t, r).Equal(first.Cert), "files are looked at no more than once a second")
	clock.Advance(time.Second)
	require.True(t, serving(t, r).Equal(second.Cert), "the rotated certificate is served without a restart")

	// Half a rotation: the new certificate without its key keeps the old
	// pair; once the key lands, the new pair is used.
	third := issue(t, ca, pki.RoleController, "ctl")
	_, _, err = third.Save(filepath.Join(dir, "half"), false)
	require.NoError(t, err)
	require.NoError(t, os.Rename(filepath.Join(dir, "half.crt"), files.Cert))
	clock.Advance(time.Second)
	require.True(t, serving(t, r).Equal(second.Cert), "a certificate whose key is not there yet is not used")
	require.NoError(t, os.Rename(filepath.Join(dir, "half.key"), files.Key))
	clock.Advance(time.Second)
	require.True(t, serving(t, r).Equal(third.Cert))

	// A new CA: clients of the new CA are accepted once it is loaded.
	newCA := newCA(t)
	client := issue(t, newCA, pki.RoleOperator, "alice").Cert
	_, err = r.VerifyClient([]*x509.Certificate{client})
	require.ErrorIs(t, err, pki.ErrForeignCA)
	writeSet(t, dir, newCA, issue(t, newCA, pki.RoleController, "ctl"))
	clock.Advance(time.Second)
	id, err := r.VerifyClient([]*x509.Certificate{client})
	require.NoError(t, err)
	require.Equal(t, "operator/alice", id.String())
}

func TestReloaderChecksIdentity(t *testing.T) {
	dir := t.TempDir()
	clock := clockwork.NewFakeClockAt(now)
	ca := newCA(t)
	files := writeSet(t, dir, ca, issue(t, ca, pki.RoleAgent, "gpu-01"))
	want := func(id pki.Identity) error {
		if id != (pki.Identity{Role: pki.RoleAgent, Name: "gpu-01"}) {
			return fmt.Errorf("is for %s, want agent/gpu-01", id)
		}
		return nil
	}
	r, err := pki.NewReloader(files, want, zaptest.NewLogger(t), pki.WithClock(clock))
	require.NoError(t, err)

	writeSet(t, dir, ca, issue(t, ca, pki.RoleAgent, "gpu-02"))
	clock.Advance(time.Second)
	require.Equal(t, "agent/gpu-01", r.Identity().String(), "a certificate for another node is not taken on reload")

	_, err = pki.NewReloader(files, want, zaptest.NewLogger(t), pki.WithClock(clock))
	require.ErrorContains(t, err, "is for agent/gpu-02, want agent/gpu-01")
}

func TestNewReloaderRefuses(t *testing.T) {
	ca := newCA(t)
	tests := []struct {
		name    string
		edit    func(t *testing.T, f *pki.Files)
		at      time.Time
		wantErr string
	}{
		{"missing key", func(t *testing.T, f *pki.Files) { f.Key = "/nonexistent/node.key" }, now, "no such file or directory"},
		{"not signed by the CA", func(t *testing.T, f *pki.Files) {
			*f = writeSet(t, t.TempDir(), newCA(t), issue(t, ca, pki.RoleAgent, "a"))
		}, now, "certificate not signed by the cluster CA"},
		{"expired", func(*testing.T, *pki.Files) {}, now.Add(48 * time.Hour), "expired at"},
		{"CA file without a certificate", func(t *testing.T, f *pki.Files) {
			require.NoError(t, os.WriteFile(f.CA, []byte("junk"), 0o644))
		}, now, "holds no PEM certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := writeSet(t, t.TempDir(), ca, issue(t, ca, pki.RoleAgent, "a"))
			tt.edit(t, &files)
			_, err := pki.NewReloader(files, nil, zaptest.NewLogger(t), pki.WithClock(clockwork.NewFakeClockAt(tt.at)))
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

// TestHandshake runs real TLS handshakes between the configurations the
// controller and its clients use.
func TestHandshake(t *testing.T) {
	ca := newCA(t)
	controller := func(t *testing.T) *pki.Issued {
		is, err := ca.Issue(pki.Request{Identity: pki.Identity{Role: pki.RoleController, Name: "ctl"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, ValidFor: time.Hour, Now: now})
		require.NoError(t, err)
		return is
	}
	tests := []struct {
		name string
		// server is the certificate the server presents; dial the address
		// the client dials.
		server     func(t *testing.T) *pki.Issued
		serverCA   *pki.CA
		dial       string
		noClient   bool
		wantErr    string
		wantClient string
	}{
		{name: "mutual", server: controller, dial: "127.0.0.1:7070", wantClient: "operator/alice"},
		{name: "by the controller's name", server: controller, dial: "ctl:7070", wantClient: "operator/alice"},
		{name: "client without certificate", server: controller, dial: "127.0.0.1:7070", noClient: true, wantClient: "none"},
		{name: "address not in the certificate", server: controller, dial: "10.0.0.9:7070", wantErr: "not 10.0.0.9"},
		{name: "server with an agent certificate", server: func(t *testing.T) *pki.Issued { return issue(t, ca, pki.RoleAgent, "ctl") }, dial: "ctl:7070", wantErr: "controller at ctl:7070"},
		{name: "server of another CA", server: func(t *testing.T) *pki.Issued { return issue(t, newCA(t), pki.RoleController, "ctl") }, dial: "ctl:7070", wantErr: "certificate not signed by the cluster CA"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := clockwork.NewFakeClockAt(now)
			// The server's CA file is the cluster CA even when its own
			// certificate is not from it: loaded with no self-check.
			srvFiles := writeSet(t, t.TempDir(), ca, tt.server(t))
			srvCert, err := tls.LoadX509KeyPair(srvFiles.Cert, srvFiles.Key)
			require.NoError(t, err)
			// No session tickets: net.Pipe is unbuffered, and nothing reads them.
			srvConf := &tls.Config{MinVersion: tls.VersionTLS13, ClientAuth: tls.RequestClientCert, Certificates: []tls.Certificate{srvCert}, SessionTicketsDisabled: true}

			cliFiles := writeSet(t, t.TempDir(), ca, issue(t, ca, pki.RoleOperator, "alice"))
			cli, err := pki.NewReloader(cliFiles, nil, zaptest.NewLogger(t), pki.WithClock(clock))
			require.NoError(t, err)
			cliConf, err := cli.ClientConfig(tt.dial)
			require.NoError(t, err)
			if tt.noClient {
				cliConf.GetClientCertificate = nil
			}

			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			srv := tls.Server(a, srvConf)
			srvDone := make(chan error, 1)
			go func() { srvDone <- srv.Handshake() }()
			cliErr := tls.Client(b, cliConf).Handshake()
			if tt.wantErr != "" {
				require.ErrorContains(t, cliErr, tt.wantErr)
				_ = a.Close()
				<-srvDone
				return
			}
			require.NoError(t, cliErr)
			require.NoError(t, <-srvDone)
			// The server side of the controller: the client's identity.
			id, err := cli.VerifyClient(srv.ConnectionState().PeerCertificates)
			if tt.wantClient == "none" {
				require.ErrorIs(t, err, pki.ErrNoCertificate)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.wantClient, id.String())
		})
	}
}

// BenchmarkVerifyClient is the controller's cost of authenticating one
// call (agents pay it once per stream, operators once per call).
func BenchmarkVerifyClient(b *testing.B) {
	ca, err := pki.NewCA("bench", time.Hour, time.Now())
	require.NoError(b, err)
	is, err := ca.Issue(pki.Request{Identity: pki.Identity{Role: pki.RoleAgent, Name: "gpu-01"}, ValidFor: time.Minute, Now: time.Now()})
	require.NoError(b, err)
	dir := b.TempDir()
	require.NoError(b, ca.Save(dir, false))
	self, err := ca.Issue(pki.Request{Identity: pki.Identity{Role: pki.RoleController, Name: "ctl"}, ValidFor: time.Minute, Now: time.Now()})
	require.NoError(b, err)
	cert, key, err := self.Save(filepath.Join(dir, "ctl"), false)
	require.NoError(b, err)
	r, err := pki.NewReloader(pki.Files{Cert: cert, Key: key, CA: filepath.Join(dir, pki.CACertFile)}, nil, zap.NewNop())
	require.NoError(b, err)
	chain := []*x509.Certificate{is.Cert}
	b.ResetTimer()
	for b.Loop() {
		if _, err := r.VerifyClient(chain); err != nil {
			b.Fatal(err)
		}
	}
}

// TestReloaderRefusesUntrustingCA: a CA file that does not verify the
// daemon's own certificate is refused (the previous CA stays in use), and
// the hook hears of it; a consistent set is taken, and the hook hears of
// that too. A certificate whose key has not landed yet is no such refusal.
func TestReloaderRefusesUntrustingCA(t *testing.T) {
	dir := t.TempDir()
	clock := clockwork.NewFakeClockAt(now)
	ca := newCA(t)
	files := writeSet(t, dir, ca, issue(t, ca, pki.RoleController, "ctl"))
	var heard []error
	r, err := pki.NewReloader(files, nil, zaptest.NewLogger(t), pki.WithClock(clock), pki.WithReloadHook(func(err error) { heard = append(heard, err) }))
	require.NoError(t, err)
	require.Equal(t, ca.Cert.NotAfter, r.CANotAfter())
	client := issue(t, ca, pki.RoleAgent, "gpu-01").Cert

	// Only the CA file replaced: the controller's certificate is of the
	// old CA.
	other, err := pki.NewCA("other", 20*365*24*time.Hour, now)
	require.NoError(t, err)
	caDir := t.TempDir()
	require.NoError(t, other.Save(caDir, false))
	data, err := os.ReadFile(filepath.Join(caDir, pki.CACertFile))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(files.CA, data, 0o644))
	clock.Advance(time.Second)
	r.Refresh()
	require.Len(t, heard, 1)
	require.ErrorIs(t, heard[0], pki.ErrOwnCertUntrusted)
	require.ErrorIs(t, heard[0], pki.ErrForeignCA)
	_, err = r.VerifyClient([]*x509.Certificate{client})
	require.NoError(t, err, "the previous CA stays in use")
	require.Equal(t, ca.Cert.NotAfter, r.CANotAfter())

	// Half a rotation is not reported as a refusal of the CA.
	half := issue(t, other, pki.RoleController, "ctl")
	_, _, err = half.Save(filepath.Join(dir, "half"), false)
	require.NoError(t, err)
	require.NoError(t, os.Rename(filepath.Join(dir, "half.crt"), files.Cert))
	clock.Advance(time.Second)
	r.Refresh()
	require.Len(t, heard, 2)
	require.Error(t, heard[1])
	require.NotErrorIs(t, heard[1], pki.ErrOwnCertUntrusted)

	require.NoError(t, os.Rename(filepath.Join(dir, "half.key"), files.Key))
	clock.Advance(time.Second)
	r.Refresh()
	require.Len(t, heard, 3)
	require.NoError(t, heard[2])
	_, err = r.VerifyClient([]*x509.Certificate{client})
	require.ErrorIs(t, err, pki.ErrForeignCA, "the new CA is in use")
	require.Equal(t, other.Cert.NotAfter, r.CANotAfter())

	clock.Advance(time.Second)
	r.Refresh()
	require.Len(t, heard, 3, "only changes are reported")
}

// TestCANotAfterDuringRotation: with old and new CA in one file, the last
// to expire bounds every certificate.
func TestCANotAfterDuringRotation(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t)
	files := writeSet(t, dir, ca, issue(t, ca, pki.RoleAgent, "gpu-01"))
	later, err := pki.NewCA("later", 20*365*24*time.Hour, now)
	require.NoError(t, err)
	caDir := t.TempDir()
	require.NoError(t, later.Save(caDir, false))
	second, err := os.ReadFile(filepath.Join(caDir, pki.CACertFile))
	require.NoError(t, err)
	first, err := os.ReadFile(files.CA)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(files.CA, append(first, second...), 0o644))
	r, err := pki.NewReloader(files, nil, zaptest.NewLogger(t), pki.WithClock(clockwork.NewFakeClockAt(now)))
	require.NoError(t, err)
	require.Equal(t, later.Cert.NotAfter, r.CANotAfter())
}

// handshake connects a client of cr to a server of conf over loopback TCP
// (both sides write at once in TLS 1.3, which an unbuffered pipe
// deadlocks), reads a byte the server sends (which delivers the session
// ticket), and reports whether the session was resumed and the client
// certificate the server holds.
func handshake(t *testing.T, conf *tls.Config, cr *pki.Reloader) (resumed bool, client *x509.Certificate) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer lis.Close()
	cc, err := net.Dial("tcp", lis.Addr().String())
	require.NoError(t, err)
	defer cc.Close()
	sc, err := lis.Accept()
	require.NoError(t, err)
	defer sc.Close()
	clientConf, err := cr.ClientConfig("ctl:7000")
	require.NoError(t, err)
	done := make(chan error, 1)
	var state tls.ConnectionState
	go func() {
		s := tls.Server(sc, conf)
		if err := s.Handshake(); err != nil {
			done <- err
			return
		}
		state = s.ConnectionState()
		_, err := s.Write([]byte{1})
		done <- err
	}()
	c := tls.Client(cc, clientConf)
	require.NoError(t, c.Handshake())
	_, err = c.Read(make([]byte, 1))
	require.NoError(t, err)
	require.NoError(t, <-done)
	require.Equal(t, state.DidResume, c.ConnectionState().DidResume)
	require.NotEmpty(t, state.PeerCertificates, "a resumed session still carries the client's certificate")
	return state.DidResume, state.PeerCertificates[0]
}

// A reconnecting client resumes its session, with a restarted server or
// another replica too when their ticket keys derive from the same secret;
// not with another secret, and not once its own certificate changed.
func TestSessionResumption(t *testing.T) {
	clock := clockwork.NewFakeClockAt(now)
	ca := newCA(t)
	sr, err := pki.NewReloader(writeSet(t, t.TempDir(), ca, issue(t, ca, pki.RoleController, "ctl")), nil, zaptest.NewLogger(t), pki.WithClock(clock))
	require.NoError(t, err)
	clientDir := t.TempDir()
	first := issue(t, ca, pki.RoleAgent, "gpu-01")
	cr, err := pki.NewReloader(writeSet(t, clientDir, ca, first), nil, zaptest.NewLogger(t), pki.WithClock(clock))
	require.NoError(t, err)
	key := func(secret byte) func(int64) [32]byte {
		return func(epoch int64) [32]byte { return [32]byte{secret, byte(epoch)} }
	}

	resumed, client := handshake(t, sr.ServerConfig(key(1)), cr)
	require.False(t, resumed, "the first connection")
	require.True(t, client.Equal(first.Cert))
	resumed, client = handshake(t, sr.ServerConfig(key(1)), cr)
	require.True(t, resumed, "a restarted controller, or another replica, with the same secret")
	require.True(t, client.Equal(first.Cert))
	// Into the next epoch (the certificates are valid for a day).
	clock.Advance(clock.Now().Truncate(pki.TicketEpoch).Add(pki.TicketEpoch + time.Minute).Sub(clock.Now()))
	resumed, _ = handshake(t, sr.ServerConfig(key(1)), cr)
	require.True(t, resumed, "a ticket opens one epoch after it was sealed")
	resumed, _ = handshake(t, sr.ServerConfig(key(2)), cr)
	require.False(t, resumed, "another secret")
	resumed, _ = handshake(t, sr.ServerConfig(nil), cr)
	require.False(t, resumed, "no ticket keys given: this server's own")
	resumed, _ = handshake(t, sr.ServerConfig(key(1)), cr)
	require.False(t, resumed, "the ticket cached last was the previous server's")

	second := issue(t, ca, pki.RoleAgent, "gpu-01")
	_, _, err = second.Save(filepath.Join(clientDir, "node"), true)
	require.NoError(t, err)
	clock.Advance(time.Second)
	resumed, client = handshake(t, sr.ServerConfig(key(1)), cr)
	require.False(t, resumed, "a rotated certificate is never hidden behind a session of the old one")
	require.True(t, client.Equal(second.Cert))
	resumed, _ = handshake(t, sr.ServerConfig(key(1)), cr)
	require.True(t, resumed)
}

// VerifyClientAgain takes a verification of the same chain as it stands
// while the CA it checked against stays loaded and every certificate of
// the chain is valid, without checking signatures again (the connection's
// chain cannot change); it verifies in full, with the usual refusals, once
// either changes.
func TestVerifyClientAgain(t *testing.T) {
	dir := t.TempDir()
	clock := clockwork.NewFakeClockAt(now)
	ca := newCA(t)
	files := writeSet(t, dir, ca, issue(t, ca, pki.RoleController, "ctl"))
	r, err := pki.NewReloader(files, nil, zaptest.NewLogger(t), pki.WithClock(clock))
	require.NoError(t, err)
	client := issue(t, ca, pki.RoleAgent, "gpu-01").Cert
	chain := []*x509.Certificate{client}
	// The same certificate under a broken signature: it only verifies
	// when the signature is not checked.
	forged := *client
	forged.Signature = append([]byte(nil), client.Signature...)
	forged.Signature[len(forged.Signature)-1] ^= 0xff
	forgedChain := []*x509.Certificate{&forged}

	first, err := r.VerifyClientAgain(pki.ChainOf(chain), pki.ClientVerification{})
	require.NoError(t, err)
	require.Equal(t, "agent/gpu-01", first.ID.String())
	require.Equal(t, pki.Serial(client), first.Serial)
	require.Equal(t, pki.IssuedAt(client), first.IssuedAt)
	_, err = r.VerifyClientAgain(pki.ChainOf(forgedChain), pki.ClientVerification{})
	require.Error(t, err, "with nothing verified before, the signature is checked")

	asked := 0
	again, err := r.VerifyClientAgain(func() []*x509.Certificate { asked++; return forgedChain }, first)
	require.NoError(t, err, "the same CA, within the chain's validity: no signature checked again")
	require.Equal(t, first, again)
	require.Zero(t, asked, "a verification that holds does not ask for the chain")

	// A new CA: the chain of the old one no longer verifies.
	other := newCA(t)
	writeSet(t, dir, other, issue(t, other, pki.RoleController, "ctl"))
	clock.Advance(time.Second)
	_, err = r.VerifyClientAgain(pki.ChainOf(chain), first)
	require.ErrorIs(t, err, pki.ErrForeignCA, "a reloaded CA verifies every chain again")

	// The old CA back, and the time past the leaf's validity.
	writeSet(t, dir, ca, issue(t, ca, pki.RoleController, "ctl"))
	clock.Advance(time.Second)
	second, err := r.VerifyClientAgain(pki.ChainOf(chain), first)
	require.NoError(t, err)
	clock.Advance(client.NotAfter.Sub(clock.Now()) + time.Second)
	_, err = r.VerifyClientAgain(pki.ChainOf(chain), second)
	var validity *pki.ValidityError
	require.ErrorAs(t, err, &validity, "past the leaf's validity it is verified again, and refused")
}
