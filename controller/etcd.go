package controller

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/soheilhy/cmux"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"

	"github.com/rdzv/rdzv/controller/keyring"
)

// embeddedStartTimeout bounds how long a single-node embedded etcd may take
// to become ready (it replays its WAL on restart).
const embeddedStartTimeout = 60 * time.Second

// EmbeddedMaxTxnOps is the embedded etcd's --max-txn-ops, eight times
// etcd's default: the controller packs writes up to it, so that a
// generation's worker reports at wire.MaxNodes are about ten
// transactions, not eighty, and the next generation's round queues behind
// fewer of them.
const EmbeddedMaxTxnOps = 1024

// The embedded etcd's raft log: etcd keeps the entries since its last
// snapshot to disk in memory after a restart (it replays them from the
// WAL), and, behind each in-memory snapshot (every 100 entries), the
// SnapshotCatchUpEntries a slow follower may need. A single member has no
// follower, and at wire.MaxNodes an entry is up to a ~100 KB transaction
// of EmbeddedMaxTxnOps writes: etcd's defaults (10,000 and 5,000 entries)
// let up to 5,100 entries stay in memory (500 MB were they all full
// transactions), and replay up to 10,000 entries on every restart. These
// bound it to about a thousand
// entries, and to two hundred once a hundred are written after a restart.
const (
	embeddedSnapshotCount  = 1000
	embeddedCatchUpEntries = 100
)

// connectEtcd starts the embedded etcd when no endpoints are configured and
// returns a client; close releases both. Embedded and external etcd are used
// through the same network client so both paths behave alike.
// timing intercepts every unary request (metrics).
func connectEtcd(ctx context.Context, cfg Config, log *zap.Logger, timing grpc.UnaryClientInterceptor) (*clientv3.Client, func(), error) {
	endpoints := cfg.Etcd.Endpoints
	stopEmbedded := func() {}
	if cfg.Embedded() {
		e, endpoint, err := startEmbedded(ctx, cfg, log.Named("etcd"))
		if err != nil {
			return nil, nil, err
		}
		stopEmbedded = e.close
		endpoints = []string{endpoint}
	}
	ecfg := clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: cfg.Etcd.DialTimeout.Duration,
		Logger:      log.Named("etcd_client").WithOptions(zap.IncreaseLevel(zap.WarnLevel)),
		Context:     ctx,
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(timing)},
	}
	if cfg.Etcd.CAFile != "" || cfg.Etcd.CertFile != "" {
		tlsInfo := transport.TLSInfo{TrustedCAFile: cfg.Etcd.CAFile, CertFile: cfg.Etcd.CertFile, KeyFile: cfg.Etcd.KeyFile}
		tlsCfg, err := tlsInfo.ClientConfig()
		if err != nil {
			stopEmbedded()
			return nil, nil, fmt.Errorf("loading etcd client TLS files (etcd.ca_file %q, etcd.cert_file %q, etcd.key_file %q): %w",
				cfg.Etcd.CAFile, cfg.Etcd.CertFile, cfg.Etcd.KeyFile, err)
		}
		ecfg.TLS = tlsCfg
	}
	cli, err := clientv3.New(ecfg)
	if err != nil {
		stopEmbedded()
		return nil, nil, fmt.Errorf("connecting to etcd %v: %w", endpoints, err)
	}
	return cli, func() { _ = cli.Close(); stopEmbedded() }, nil
}

// startEmbedded runs a single-member etcd whose only listener is a Unix
// socket in the data directory: no TCP port a local user could reach, and
// the directory (0700) admits only the controller's user and root. There
// is no peer listener at all; a single member never dials a peer. It
// returns the client endpoint.
func startEmbedded(ctx context.Context, cfg Config, log *zap.Logger) (e *embeddedEtcd, endpoint string, err error) {
	sock, err := filepath.Abs(cfg.EmbeddedEtcdSocket())
	if err != nil {
		return nil, "", fmt.Errorf("resolving the embedded etcd socket in data_dir %q: %w", cfg.DataDir, err)
	}
	if err := privateDir(cfg.DataDir, log); err != nil {
		return nil, "", err
	}
	// etcd removes a socket file it finds before listening, which would
	// cut off a controller still serving on it (same data_dir by mistake).
	if conn, err := net.Dial("unix", sock); err == nil {
		_ = conn.Close()
		return nil, "", fmt.Errorf("%s already answers: another controller is running with data_dir %s", sock, cfg.DataDir)
	}
	clientURL := url.URL{Scheme: "unix", Path: sock}
	ec := embed.NewConfig()
	ec.Name = "rdzv"
	ec.Dir = cfg.DataDir
	ec.ListenClientUrls = []url.URL{clientURL}
	// etcd requires advertised URLs to be host:port, which a socket path is
	// not. A single member needs to advertise no client URL (empty, not nil:
	// nil means "unset" to etcd), and its peer URL only names the member:
	// nothing listens on it and nothing dials it.
	ec.AdvertiseClientUrls = []url.URL{}
	ec.ListenPeerUrls = nil
	ec.AdvertisePeerUrls = []url.URL{{Scheme: "unix", Host: "rdzv-embedded-etcd:0"}}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	// The HTTP/JSON gateway is an extra client endpoint nothing here uses.
	ec.EnableGRPCGateway = false
	// No auto-compaction here: the leader compacts (etcd.compaction_interval)
	// whichever etcd it uses.
	// embed.NewConfig leaves the slow-request threshold at zero, which logs
	// every request as slow; use etcd's own default.
	ec.WarningUnaryRequestDuration = embed.DefaultWarningUnaryRequestDuration
	ec.MaxTxnOps = EmbeddedMaxTxnOps
	ec.SnapshotCount, ec.SnapshotCatchUpEntries = embeddedSnapshotCount, embeddedCatchUpEntries
	e = &embeddedEtcd{}
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(log.WithOptions(zap.IncreaseLevel(zap.WarnLevel),
		zap.WrapCore(func(core zapcore.Core) zapcore.Core { return closingCore{Core: core, closing: &e.closing} })))
	if e.Etcd, err = embed.StartEtcd(ec); err != nil {
		return nil, "", fmt.Errorf("starting embedded etcd in %s: %w", cfg.DataDir, err)
	}
	// The directory already keeps everyone else out; the socket's own mode
	// does too, whatever the umask was.
	if err := os.Chmod(sock, 0o600); err != nil {
		e.Close()
		return nil, "", fmt.Errorf("restricting the embedded etcd socket %s to its owner: %w", sock, err)
	}
	select {
	case <-e.Server.ReadyNotify():
		log.Info("embedded etcd ready", zap.String("data_dir", cfg.DataDir), zap.String("socket", sock))
		return e, clientURL.String(), nil
	case err := <-e.Err():
		e.Close()
		return nil, "", fmt.Errorf("embedded etcd failed while starting: %w", err)
	case <-time.After(embeddedStartTimeout):
		e.Close()
		return nil, "", fmt.Errorf("embedded etcd in %s not ready after %s", cfg.DataDir, embeddedStartTimeout)
	case <-ctx.Done():
		e.Close()
		return nil, "", ctx.Err()
	}
}

// openKeyring reads the key file that seals jobs' secrets in etcd. The
// default one (secrets_key_file unset) is created on first start with
// embedded etcd. With external etcd, or a file named explicitly, a missing
// file is an error: a fresh key there would not open what the other
// replicas sealed (or a mistyped path would hide the real keyring).
func openKeyring(cfg Config, now time.Time, log *zap.Logger) (*keyring.Keyring, error) {
	path := cfg.SecretsKeyPath()
	create := cfg.Embedded() && cfg.SecretsKeyFile == ""
	if create {
		if err := privateDir(cfg.DataDir, log); err != nil {
			return nil, err
		}
	}
	keys, created, err := keyring.LoadOrCreate(path, create, now)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("secrets_key_file: %s does not exist; with external etcd or an explicit secrets_key_file it is not created: make one (docs/jobs.md#secrets) and give every controller replica the same file: %w", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("secrets_key_file: %w", err)
	}
	if created {
		log.Info("secrets key file created; back it up: without it, stored jobs' secret_env cannot be read", zap.String("path", path))
	}
	log.Info("secrets keyring loaded", zap.String("path", path), zap.String("primary_key", keys.Primary()))
	return keys, nil
}

// privateDir makes dir exist with no access for group and others. A
// looser existing directory is tightened: it is the controller's own
// (systemd's StateDirectory= creates it 0755 unless told otherwise, and
// does not change an existing one's mode), and left as is it would let
// any local user reach the etcd socket inside.
func privateDir(dir string, log *zap.Logger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating data_dir %s: %w", dir, err)
	}
	info, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("checking data_dir %s: %w", dir, err)
	}
	if !info.IsDir() {
		return fmt.Errorf("data_dir: %s is not a directory", dir)
	}
	if mode := info.Mode().Perm(); mode&0o077 != 0 {
		if err := os.Chmod(dir, mode&0o700); err != nil {
			return fmt.Errorf("data_dir %s has mode %04o, open to other users, and could not be restricted to its owner: %w", dir, mode, err)
		}
		log.Warn("data dir was open to other users; restricted it to its owner",
			zap.String("data_dir", dir), zap.String("old_mode", fmt.Sprintf("%04o", mode)), zap.String("mode", fmt.Sprintf("%04o", mode&0o700)))
	}
	return nil
}

// embeddedEtcd is the embedded etcd and whether it is being closed.
type embeddedEtcd struct {
	*embed.Etcd
	closing atomic.Bool
}

func (e *embeddedEtcd) close() {
	e.closing.Store(true)
	e.Close()
}

// closingCore demotes to debug the errors embedded etcd logs, stack trace
// and all, for each of its listeners and servers that Close shuts: etcd's
// errHandler logs whatever a server's Serve returned, and on Close that is
// always "use of closed network connection", "http: Server closed" or
// cmux's "mux: server closed". A clean shutdown must log no error (log
// alerts fire on them); any other error, or one before Close, is kept.
type closingCore struct {
	zapcore.Core
	closing *atomic.Bool
}

func (c closingCore) With(fields []zapcore.Field) zapcore.Core {
	return closingCore{Core: c.Core.With(fields), closing: c.closing}
}

func (c closingCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if ent.Level >= zapcore.ErrorLevel && c.closing.Load() {
		// Decided in Write, which sees the fields.
		return ce.AddCore(ent, c)
	}
	return c.Core.Check(ent, ce)
}

func (c closingCore) Write(ent zapcore.Entry, fields []zapcore.Field) error {
	if ent.Level >= zapcore.ErrorLevel && c.closing.Load() && closedServerError(fields) {
		if !c.Core.Enabled(zapcore.DebugLevel) {
			return nil
		}
		ent.Level, ent.Stack = zapcore.DebugLevel, ""
	}
	return c.Core.Write(ent, fields)
}

// closedServerError reports whether fields carry an error that only says
// a server or listener was closed.
func closedServerError(fields []zapcore.Field) bool {
	for _, f := range fields {
		if f.Type != zapcore.ErrorType {
			continue
		}
		err, ok := f.Interface.(error)
		return ok && (errors.Is(err, net.ErrClosed) || errors.Is(err, http.ErrServerClosed) || errors.Is(err, cmux.ErrServerClosed))
	}
	return false
}
