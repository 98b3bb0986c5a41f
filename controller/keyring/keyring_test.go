package keyring_test

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/controller/keyring"
)

var now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func keyLine(id string, b byte) string {
	return id + " " + base64.StdEncoding.EncodeToString([]byte(strings.Repeat(string(b), keyring.KeyBytes))) + "\n"
}

func write(t *testing.T, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secrets.key")
	require.NoError(t, os.WriteFile(p, []byte(content), mode))
	require.NoError(t, os.Chmod(p, mode))
	return p
}

func TestLoadRejects(t *testing.T) {
	secretKey := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("s", keyring.KeyBytes)))
	tests := []struct {
		name    string
		content string
		mode    os.FileMode
		want    string
	}{
		{"readable by others", keyLine("k1", 'a'), 0o644, "mode 0644"},
		{"writable by group", keyLine("k1", 'a'), 0o620, "mode 0620"},
		{"empty", "# nothing\n\n", 0o600, "no key in it"},
		{"one field", "k1\n", 0o600, "line 1: want \"ID BASE64-KEY\", got 1 fields"},
		{"three fields", "# c\nk1 " + secretKey + " extra\n", 0o600, "line 2: want"},
		{"bad id", "k/1 " + secretKey + "\n", 0o600, "line 1: key ID must be"},
		{"short key", "k1 " + base64.StdEncoding.EncodeToString([]byte("short")) + "\n", 0o600, `key "k1" must be 32 bytes`},
		{"not base64", "k1 %%%%\n", 0o600, `key "k1" must be 32 bytes`},
		{"duplicate id", keyLine("k1", 'a') + keyLine("k1", 'b'), 0o600, `line 2: key ID "k1" appears twice`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := write(t, tt.content, tt.mode)
			_, err := keyring.Load(p)
			require.ErrorContains(t, err, tt.want)
			require.ErrorContains(t, err, p, "the error names the file")
			require.NotContains(t, err.Error(), secretKey, "the error quotes a key")
		})
	}
	_, err := keyring.Load(filepath.Join(t.TempDir(), "missing"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestSealOpen(t *testing.T) {
	k, err := keyring.Load(write(t, "# keys\n"+keyLine("new", 'n')+keyLine("old", 'o'), 0o600))
	require.NoError(t, err)
	require.Equal(t, "new", k.Primary())
	ctx := []byte("job\x00HF_TOKEN")

	sealed, err := k.Seal("hf_secret", ctx)
	require.NoError(t, err)
	require.NotContains(t, sealed, "hf_secret")
	require.True(t, strings.HasPrefix(sealed, "rdzv-sealed:v1:new:"), sealed)
	again, err := k.Seal("hf_secret", ctx)
	require.NoError(t, err)
	require.NotEqual(t, sealed, again, "every seal has its own nonce")

	plain, primary, err := k.Open(sealed, ctx)
	require.NoError(t, err)
	require.Equal(t, "hf_secret", plain)
	require.True(t, primary)

	_, _, err = k.Open(sealed, []byte("other-job\x00HF_TOKEN"))
	require.ErrorIs(t, err, keyring.ErrOpen, "a value moved to another job does not open")
	_, _, err = k.Open(sealed[:len(sealed)-2]+"AA", ctx)
	require.ErrorIs(t, err, keyring.ErrOpen, "an altered value does not open")
	_, _, err = k.Open("hf_plain", ctx)
	require.ErrorIs(t, err, keyring.ErrNotSealed)
	_, _, err = k.Open("rdzv-sealed:v1:gone:AAAA", ctx)
	require.ErrorIs(t, err, keyring.ErrUnknownKey)
	require.ErrorContains(t, err, `key "gone" is not in`)
	_, _, err = k.Open("rdzv-sealed:v1:new:!!", ctx)
	require.ErrorIs(t, err, keyring.ErrOpen)

	// Rotation: what the old key sealed still opens, and is reported as
	// not sealed with the primary key.
	old, err := keyring.Load(write(t, keyLine("old", 'o'), 0o600))
	require.NoError(t, err)
	byOld, err := old.Seal("v", ctx)
	require.NoError(t, err)
	plain, primary, err = k.Open(byOld, ctx)
	require.NoError(t, err)
	require.Equal(t, "v", plain)
	require.False(t, primary)

	// Same ID, other key material: refused, not garbage.
	impostor, err := keyring.Load(write(t, keyLine("new", 'x'), 0o600))
	require.NoError(t, err)
	_, _, err = impostor.Open(sealed, ctx)
	require.ErrorIs(t, err, keyring.ErrOpen)
}

func TestLoadOrCreate(t *testing.T) {
	p := filepath.Join(t.TempDir(), "secrets.key")
	_, _, err := keyring.LoadOrCreate(p, false, now)
	require.ErrorIs(t, err, os.ErrNotExist, "not created unless asked")

	k, created, err := keyring.LoadOrCreate(p, true, now)
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, "20260102T030405Z", k.Primary())
	info, err := os.Stat(p)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	sealed, err := k.Seal("v", nil)
	require.NoError(t, err)
	k2, created, err := keyring.LoadOrCreate(p, true, now.Add(time.Hour))
	require.NoError(t, err)
	require.False(t, created, "an existing file is kept")
	plain, _, err := k2.Open(sealed, nil)
	require.NoError(t, err)
	require.Equal(t, "v", plain)

	require.ErrorIs(t, keyring.Create(p, now), os.ErrExist)
}

// Replicas with the same key file derive the same keys; a different
// purpose, or a new primary key, derives another; none is the key itself.
func TestDerive(t *testing.T) {
	file := keyLine("new", 'n') + keyLine("old", 'o')
	a, err := keyring.Load(write(t, file, 0o600))
	require.NoError(t, err)
	b, err := keyring.Load(write(t, file, 0o600))
	require.NoError(t, err)
	rotated, err := keyring.Load(write(t, keyLine("newer", 'r')+file, 0o600))
	require.NoError(t, err)

	k := a.Derive("tls tickets 1")
	require.Equal(t, k, b.Derive("tls tickets 1"), "another replica, the same file")
	require.NotEqual(t, k, a.Derive("tls tickets 2"))
	require.NotEqual(t, k, rotated.Derive("tls tickets 1"), "derived from the primary key")
	require.NotEqual(t, strings.Repeat("n", keyring.KeyBytes), string(k[:]))
}
