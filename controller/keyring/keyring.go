// Package keyring seals the secret values the controller keeps in etcd
// (jobs' secret_env) with AES-256-GCM, under keys read from a file on the
// controller, so that a copy of etcd's data (a backup, a snapshot, a member
// disk, a reader of the external cluster) does not give the secrets away.
//
// # Key file
//
// One key per line, "ID BASE64", where ID is [A-Za-z0-9._-]{1,64} and
// BASE64 is 32 random bytes in standard base64; blank lines and lines
// starting with '#' are ignored. The first key seals every new value; the
// others only open values sealed with them, which is what rotation needs:
// put a new key first, let the controller reseal (it does on taking the
// lead), then drop the old one. The file must be readable by its owner
// only.
//
// # Sealed values
//
// "rdzv-sealed:v1:ID:BASE64(nonce || ciphertext)". The caller passes a
// context (the job and variable name) that is authenticated with the
// value, so a sealed value moved to another job or variable does not open.
package keyring

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"strings"
	"time"
)

// KeyBytes is the size of an AES-256 key.
const KeyBytes = 32

const sealedPrefix = "rdzv-sealed:v1:"

// maxFileBytes bounds the key file; a keyring has a handful of lines.
const maxFileBytes = 64 << 10

var keyID = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// ErrNotSealed means a value does not have the sealed form: it was stored
// in plaintext (by a version before sealing).
var ErrNotSealed = errors.New("value is not sealed")

// ErrUnknownKey means a value was sealed with a key that is not in the
// keyring (removed too early, or another controller's key file).
var ErrUnknownKey = errors.New("sealed with a key that is not in the keyring")

// ErrOpen means a value did not open with the key it names: another key of
// the same ID, or a value altered or moved to another context.
var ErrOpen = errors.New("sealed value does not open")

// Keyring holds the keys of one key file.
type Keyring struct {
	path    string
	primary string
	aeads   map[string]cipher.AEAD
	// derive is keyed by the primary key (Derive).
	derive []byte
}

// Load reads the key file at path. It refuses a file that anyone but its
// owner may read or write.
func Load(path string) (*Keyring, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("secrets key file: %w", err)
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("secrets key file %s: not a regular file", path)
	}
	if mode := info.Mode().Perm(); mode&0o077 != 0 {
		return nil, fmt.Errorf("secrets key file %s: mode %04o lets other users read or change the keys; it must be accessible by its owner only (chmod 0600 %s)", path, mode, path)
	}
	if info.Size() > maxFileBytes {
		return nil, fmt.Errorf("secrets key file %s: %d bytes, at most %d expected", path, info.Size(), maxFileBytes)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("secrets key file: %w", err)
	}
	return parse(path, data)
}

func parse(path string, data []byte) (*Keyring, error) {
	k := &Keyring{path: path, aeads: map[string]cipher.AEAD{}}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		// Never quote the line: it holds a key.
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return nil, fmt.Errorf("secrets key file %s line %d: want \"ID BASE64-KEY\", got %d fields", path, n, len(fields))
		}
		id := fields[0]
		if !keyID.MatchString(id) {
			return nil, fmt.Errorf("secrets key file %s line %d: key ID must be 1-64 of [A-Za-z0-9._-]", path, n)
		}
		if k.aeads[id] != nil {
			return nil, fmt.Errorf("secrets key file %s line %d: key ID %q appears twice", path, n, id)
		}
		key, err := base64.StdEncoding.DecodeString(fields[1])
		if err != nil || len(key) != KeyBytes {
			return nil, fmt.Errorf("secrets key file %s line %d: key %q must be %d bytes in standard base64", path, n, id, KeyBytes)
		}
		aead, err := newAEAD(key)
		if err != nil {
			return nil, fmt.Errorf("secrets key file %s line %d: %w", path, n, err)
		}
		k.aeads[id] = aead
		if k.primary == "" {
			k.primary, k.derive = id, key
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("secrets key file %s: %w", path, err)
	}
	if k.primary == "" {
		return nil, fmt.Errorf("secrets key file %s: no key in it (want lines \"ID BASE64-KEY\")", path)
	}
	return k, nil
}

func newAEAD(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// Create writes a new key file at path holding one fresh key, named after
// now, readable by its owner only. It never replaces an existing file.
func Create(path string, now time.Time) error {
	key := make([]byte, KeyBytes)
	if _, err := rand.Read(key); err != nil {
		return fmt.Errorf("generating a secrets key: %w", err)
	}
	content := fmt.Sprintf("# rdzv-controller secrets keyring: \"ID BASE64-KEY\" per line; the first seals, all open.\n%s %s\n",
		now.UTC().Format("20060102T150405Z"), base64.StdEncoding.EncodeToString(key))
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("creating secrets key file: %w", err)
	}
	if _, err := f.WriteString(content); err != nil {
		_ = f.Close()
		_ = os.Remove(path)
		return fmt.Errorf("writing secrets key file %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		_ = os.Remove(path)
		return fmt.Errorf("writing secrets key file %s: %w", path, err)
	}
	return f.Close()
}

// LoadOrCreate loads path, first creating it with a fresh key when it does
// not exist and create is set.
func LoadOrCreate(path string, create bool, now time.Time) (k *Keyring, created bool, err error) {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) && create {
		if err := Create(path, now); err != nil {
			return nil, false, err
		}
		created = true
	}
	k, err = Load(path)
	return k, created, err
}

// Path is the key file the keyring was read from.
func (k *Keyring) Path() string { return k.path }

// Primary is the ID of the key new values are sealed with.
func (k *Keyring) Primary() string { return k.primary }

// Derive is a key for purpose, derived from the primary key with
// HMAC-SHA256 (HKDF's expand step, the key being uniformly random
// already): every replica shares the key file, so they derive the same
// keys, and no other use learns the sealing key. A new primary key derives
// new keys.
func (k *Keyring) Derive(purpose string) [KeyBytes]byte {
	m := hmac.New(sha256.New, k.derive)
	m.Write([]byte("rdzv keyring derive v1\x00" + purpose))
	return [KeyBytes]byte(m.Sum(nil))
}

// Seal encrypts plaintext under the primary key, bound to context.
func (k *Keyring) Seal(plaintext string, context []byte) (string, error) {
	aead := k.aeads[k.primary]
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(plaintext)+aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("sealing a secret: %w", err)
	}
	out := aead.Seal(nonce, nonce, []byte(plaintext), context)
	return sealedPrefix + k.primary + ":" + base64.RawStdEncoding.EncodeToString(out), nil
}

// Open decrypts a value Seal returned for the same context, and reports
// whether it was sealed with the primary key (if not, it should be sealed
// again). Errors never quote the value.
func (k *Keyring) Open(sealed string, context []byte) (plaintext string, primary bool, err error) {
	rest, ok := strings.CutPrefix(sealed, sealedPrefix)
	if !ok {
		return "", false, ErrNotSealed
	}
	id, body, ok := strings.Cut(rest, ":")
	if !ok || !keyID.MatchString(id) {
		return "", false, fmt.Errorf("%w: malformed sealed value", ErrOpen)
	}
	aead := k.aeads[id]
	if aead == nil {
		return "", false, fmt.Errorf("%w: key %q is not in %s", ErrUnknownKey, id, k.path)
	}
	raw, err := base64.RawStdEncoding.DecodeString(body)
	if err != nil || len(raw) < aead.NonceSize()+aead.Overhead() {
		return "", false, fmt.Errorf("%w: malformed sealed value (key %q)", ErrOpen, id)
	}
	out, err := aead.Open(nil, raw[:aead.NonceSize()], raw[aead.NonceSize():], context)
	if err != nil {
		return "", false, fmt.Errorf("%w with key %q from %s: another key of that ID, or the value was altered", ErrOpen, id, k.path)
	}
	return string(out), id == k.primary, nil
}
