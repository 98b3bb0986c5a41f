package controller

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// embeddedStartTimeout bounds how long a single-node embedded etcd may take
// to become ready (it replays its WAL on restart).
const embeddedStartTimeout = 60 * time.Second

// connectEtcd starts the embedded etcd when no endpoints are configured and
// returns a client; close releases both. Embedded and external etcd are used
// through the same network client so both paths behave alike.
func connectEtcd(ctx context.Context, cfg Config, log *zap.Logger) (*clientv3.Client, func(), error) {
	endpoints := cfg.Etcd.Endpoints
	stopEmbedded := func() {}
	if cfg.Embedded() {
		e, err := startEmbedded(ctx, cfg, log.Named("etcd"))
		if err != nil {
			return nil, nil, err
		}
		stopEmbedded = e.Close
		endpoints = []string{cfg.EmbeddedEtcd.ClientURL}
	}
	ecfg := clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: cfg.Etcd.DialTimeout.Duration,
		Logger:      log.Named("etcd_client").WithOptions(zap.IncreaseLevel(zap.WarnLevel)),
		Context:     ctx,
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

func startEmbedded(ctx context.Context, cfg Config, log *zap.Logger) (*embed.Etcd, error) {
	clientURL, err := url.Parse(cfg.EmbeddedEtcd.ClientURL)
	if err != nil {
		return nil, fmt.Errorf("parsing embedded_etcd.client_url: %w", err)
	}
	peerURL, err := url.Parse(cfg.EmbeddedEtcd.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("parsing embedded_etcd.peer_url: %w", err)
	}
	ec := embed.NewConfig()
	ec.Name = "rdzv"
	ec.Dir = cfg.DataDir
	ec.ListenClientUrls = []url.URL{*clientURL}
	ec.AdvertiseClientUrls = []url.URL{*clientURL}
	ec.ListenPeerUrls = []url.URL{*peerURL}
	ec.AdvertisePeerUrls = []url.URL{*peerURL}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	// No auto-compaction here: the leader compacts (etcd.compaction_interval)
	// whichever etcd it uses.
	// embed.NewConfig leaves the slow-request threshold at zero, which logs
	// every request as slow; use etcd's own default.
	ec.WarningUnaryRequestDuration = embed.DefaultWarningUnaryRequestDuration
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(log.WithOptions(zap.IncreaseLevel(zap.WarnLevel)))
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("starting embedded etcd in %s: %w", cfg.DataDir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
		log.Info("embedded etcd ready", zap.String("data_dir", cfg.DataDir), zap.String("client_url", clientURL.String()))
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd failed while starting: %w", err)
	case <-time.After(embeddedStartTimeout):
		e.Close()
		return nil, fmt.Errorf("embedded etcd in %s not ready after %s", cfg.DataDir, embeddedStartTimeout)
	case <-ctx.Done():
		e.Close()
		return nil, ctx.Err()
	}
}
