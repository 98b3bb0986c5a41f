package pki

import (
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"github.com/rdzv/rdzv/wire"
	"io/fs"
	"os"
	"path/filepath"
)

// Files names a daemon's TLS material; configs embed it as `tls`.
type Files struct {
	// Cert and Key are this daemon's certificate and private key (PEM).
	Cert string `json:"cert"`
	Key  string `json:"key"`
	// CA is the cluster CA certificate (PEM) peers are verified against.
	CA string `json:"ca"`
}

// Validate requires every file; field is the config path ("tls").
func (f Files) Validate(field string) error {
	var errs []error
	for _, p := range []struct{ name, path string }{{"cert", f.Cert}, {"key", f.Key}, {"ca", f.CA}} {
		if p.path == "" {
			errs = append(errs, wire.Fieldf(field+"."+p.name, "required (issue certificates with `rdzvctl pki`; set --insecure only for local tests)"))
		}
	}
	return errors.Join(errs...)
}

// File names in a CA directory (`rdzvctl pki init --dir DIR`).
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
)

// ErrExists is returned instead of overwriting key material without force.
var ErrExists = errors.New("already exists")

// DefaultOut is where `rdzvctl pki issue` writes a certificate by default:
// DIR/ROLE-NAME.crt and DIR/ROLE-NAME.key.
func DefaultOut(dir string, id Identity) string {
	return filepath.Join(dir, string(id.Role)+"-"+id.Name)
}

// Save writes the CA into dir as ca.crt and ca.key (0600).
func (ca *CA) Save(dir string, force bool) error {
	keyPEM, err := encodeKey(ca.Key)
	if err != nil {
		return err
	}
	return writeFiles(force,
		file{filepath.Join(dir, CACertFile), encodeCert(ca.Cert), 0o644},
		file{filepath.Join(dir, CAKeyFile), keyPEM, 0o600})
}

// LoadCA reads the CA that Save wrote into dir.
func LoadCA(dir string) (*CA, error) {
	cert, err := ReadCert(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, err
	}
	keyPath := filepath.Join(dir, CAKeyFile)
	data, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("reading CA key: %w", err)
	}
	key, err := decodeKey(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keyPath, err)
	}
	if !cert.IsCA || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("%s and %s are not a CA certificate and its key", filepath.Join(dir, CACertFile), keyPath)
	}
	return &CA{Cert: cert, Key: key}, nil
}

// Save writes the certificate to prefix.crt and its key to prefix.key
// (0600) and returns both paths.
func (is *Issued) Save(prefix string, force bool) (certPath, keyPath string, err error) {
	keyPEM, err := encodeKey(is.Key)
	if err != nil {
		return "", "", err
	}
	certPath, keyPath = prefix+".crt", prefix+".key"
	return certPath, keyPath, writeFiles(force, file{certPath, encodeCert(is.Cert), 0o644}, file{keyPath, keyPEM, 0o600})
}

type file struct {
	path string
	data []byte
	perm fs.FileMode
}

// writeFiles refuses before writing anything if a file exists and force is
// not set, so a mistake never leaves half a pair replaced. Each file is
// written to a temporary name and renamed, so a daemon reloading it never
// reads a partial file.
func writeFiles(force bool, files ...file) error {
	if !force {
		for _, f := range files {
			if _, err := os.Lstat(f.path); err == nil {
				return fmt.Errorf("%s %w; pass --force to replace it", f.path, ErrExists)
			}
		}
	}
	for _, f := range files {
		dir := filepath.Dir(f.path)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", dir, err)
		}
		tmp, err := os.CreateTemp(dir, "."+filepath.Base(f.path)+".*")
		if err != nil {
			return fmt.Errorf("writing %s: %w", f.path, err)
		}
		err = tmp.Chmod(f.perm)
		if err == nil {
			_, err = tmp.Write(f.data)
		}
		if err == nil {
			err = tmp.Sync()
		}
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp.Name(), f.path)
		}
		if err != nil {
			_ = os.Remove(tmp.Name())
			return fmt.Errorf("writing %s: %w", f.path, err)
		}
	}
	return nil
}

func encodeCert(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

func encodeKey(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("encoding private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func decodeKey(data []byte) (*ecdsa.PrivateKey, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, errors.New("not a PEM \"PRIVATE KEY\"")
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parsing private key: %w", err)
	}
	ec, ok := key.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("private key is %T, want ECDSA", key)
	}
	return ec, nil
}

// ReadCert reads the first certificate of a PEM file.
func ReadCert(path string) (*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading certificate: %w", err)
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s: not a PEM certificate", path)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cert, nil
}
