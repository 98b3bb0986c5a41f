package httpserve

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"
)

// reloadCheckEvery bounds how often the certificate files are looked at.
const reloadCheckEvery = time.Second

// keyPair serves the certificate in its files, read again when either
// changes, so that a renewed certificate is used from the next handshake
// without a restart, as the daemons' cluster certificates are. A pair that
// does not load (the key written a moment after the certificate) keeps the
// previous one until the files change again.
type keyPair struct {
	certFile, keyFile string
	log               *zap.Logger

	mu      sync.Mutex
	checked time.Time
	stamps  [2]fileStamp
	cur     *tls.Certificate
}

type fileStamp struct {
	mod  time.Time
	size int64
}

func loadKeyPair(certFile, keyFile string, log *zap.Logger) (*keyPair, error) {
	k := &keyPair{certFile: certFile, keyFile: keyFile, log: log}
	stamps, err := k.stat()
	if err == nil {
		var cert tls.Certificate
		if cert, err = tls.LoadX509KeyPair(certFile, keyFile); err == nil {
			k.cur, k.stamps, k.checked = &cert, stamps, time.Now()
			return k, nil
		}
	}
	return nil, fmt.Errorf("http.cert_file %q, http.key_file %q: %w", certFile, keyFile, err)
}

func (k *keyPair) stat() ([2]fileStamp, error) {
	var out [2]fileStamp
	var errs []error
	for i, f := range []string{k.certFile, k.keyFile} {
		info, err := os.Stat(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out[i] = fileStamp{mod: info.ModTime(), size: info.Size()}
	}
	return out, errors.Join(errs...)
}

// get is tls.Config.GetCertificate.
func (k *keyPair) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if time.Since(k.checked) < reloadCheckEvery {
		return k.cur, nil
	}
	k.checked = time.Now()
	stamps, err := k.stat()
	if err != nil || stamps == k.stamps {
		return k.cur, nil
	}
	k.stamps = stamps
	cert, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		k.log.Warn("http tls files changed but do not load, keeping the previous certificate", zap.Error(err))
		return k.cur, nil
	}
	k.cur = &cert
	k.log.Info("http tls certificate reloaded", zap.String("cert_file", k.certFile))
	return k.cur, nil
}
