package secrets

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Stable placeholders: a git remote URL, an .npmrc or a tool's config file
// saved with a placeholder in it works in the next run only if that run
// hands out the same placeholder. With a project key (one random key per
// project, kept in the user's state directory), a placeholder is
// HMAC-SHA-256(key, name), cut to 32 hex digits: the same for every run of
// the project, different between projects, and never derived from the
// secret's value (a placeholder tells nothing of it).

// keyLen is a project key's length: 256 bits.
const keyLen = 32

// stableToken is the placeholder's random part for name under key.
func stableToken(key []byte, name string) string {
	m := hmac.New(sha256.New, key)
	io.WriteString(m, "tunwall placeholder v1\x00"+name)
	return hex.EncodeToString(m.Sum(nil))[:tokenHexLen]
}

// ProjectKeyPath is where the key of project (an absolute directory) is
// kept under dir (the user's tunwall state directory): one file per
// project, named by a hash of its path.
func ProjectKeyPath(dir, project string) string {
	sum := sha256.Sum256([]byte(project))
	return filepath.Join(dir, "placeholder-keys", hex.EncodeToString(sum[:16])+".key")
}

// ProjectKey returns the placeholder key of project, kept in the file
// ProjectKeyPath names: made (random, mode 0600, in a 0700 directory) the
// first time, read after. A key file that is not a regular file of the
// user's, that group or others may read or write, or that holds anything
// but 64 hex digits, is an error: remove it and a new key (and new
// placeholders) is made.
func ProjectKey(dir, project string) ([]byte, error) {
	path := ProjectKeyPath(dir, project)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("placeholder key: %w", err)
	}
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		if err := createKey(path); err != nil {
			return nil, fmt.Errorf("placeholder key %s: %w", path, err)
		}
	}
	key, err := readKey(path)
	if err != nil {
		return nil, fmt.Errorf("placeholder key %s: %w (remove it to make a new key; the project's placeholders change)", path, err)
	}
	return key, nil
}

// createKey writes a new key to a temporary file and links it to path:
// of two runs starting at once, one key wins and both read it.
func createKey(path string) error {
	var k [keyLen]byte
	if _, err := io.ReadFull(rand.Reader, k[:]); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".new-key-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	_, err = f.WriteString(hex.EncodeToString(k[:]) + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Link(f.Name(), path); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return nil
}

// readKey reads and checks a key file, never following a symlink.
func readKey(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, errors.New("not a regular file")
	case int(st.Uid) != os.Geteuid():
		return nil, fmt.Errorf("owned by uid %d, not %d", st.Uid, os.Geteuid())
	case st.Mode&0o077 != 0:
		return nil, fmt.Errorf("group or others may read or write it (mode %04o); want 0600", st.Mode&0o7777)
	}
	b, err := io.ReadAll(io.LimitReader(f, 2*keyLen+2))
	if err != nil {
		return nil, err
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(key) != keyLen {
		return nil, fmt.Errorf("does not hold a %d-hex-digit key", 2*keyLen)
	}
	return key, nil
}
