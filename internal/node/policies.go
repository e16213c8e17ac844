package node

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/tunwall/tunwall/internal/nodeapi"
	"github.com/tunwall/tunwall/policy"
)

// maxPolicySize bounds one policy file (as tunwall run's --policy).
const maxPolicySize = 4 << 20

// maxPolicies bounds the policies the agent keeps loaded: those of the
// pods it serves, at most one each.
const maxPolicies = 4096

// version is one parsed version of a policy file.
type version struct {
	name string
	path string
	pol  *policy.Policy
	src  []byte
	sum  [sha256.Size]byte
}

// policyFile is a policy the agent has loaded: the version in effect and
// what the file looked like when it was last read.
type policyFile struct {
	cur     *version
	modTime time.Time
	size    int64
	lastErr string // the error last reported for it ("" none): said once per change
}

// policies reads the policy directory: NAME.yaml per policy. A policy is
// read when a pod first needs it, and from then on polled (mtime, size,
// then its SHA-256): a new version that parses replaces it; one that does
// not keeps the old version, and is reported once and counted.
type policies struct {
	dir string

	mu     sync.Mutex
	files  map[string]*policyFile
	errors map[string]uint64 // reload errors, per policy
}

func newPolicies(dir string) *policies {
	return &policies{dir: dir, files: map[string]*policyFile{}, errors: map[string]uint64{}}
}

func (p *policies) path(name string) string { return filepath.Join(p.dir, name+".yaml") }

// exists says whether the directory holds policy name (a regular file,
// symlinks followed: a ConfigMap's files are symlinks).
func (p *policies) exists(name string) bool {
	if nodeapi.CheckPolicyName(name) != nil {
		return false
	}
	st, err := os.Stat(p.path(name))
	return err == nil && st.Mode().IsRegular()
}

// get returns the version of policy name in effect, reading it the first
// time.
func (p *policies) get(name string) (*version, error) {
	if err := nodeapi.CheckPolicyName(name); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if f := p.files[name]; f != nil {
		return f.cur, nil
	}
	if len(p.files) >= maxPolicies {
		return nil, fmt.Errorf("policy %s: %d policies in use already", name, maxPolicies)
	}
	v, st, err := p.read(name)
	if err != nil {
		return nil, err
	}
	p.files[name] = &policyFile{cur: v, modTime: st.ModTime(), size: st.Size()}
	return v, nil
}

// read reads and parses policy name.
func (p *policies) read(name string) (*version, os.FileInfo, error) {
	path := p.path(name)
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("policy %s: %w", name, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("policy %s: %w", name, err)
	}
	if !st.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("policy %s: %s is not a regular file", name, path)
	}
	src, err := io.ReadAll(io.LimitReader(f, maxPolicySize+1))
	if err != nil {
		return nil, nil, fmt.Errorf("policy %s: %w", name, err)
	}
	if len(src) > maxPolicySize {
		return nil, nil, fmt.Errorf("policy %s: larger than %d MiB", name, maxPolicySize>>20)
	}
	pol, err := policy.Parse(path, src)
	if err != nil {
		return nil, nil, err // "FILE:LINE:COL: ..."
	}
	return &version{name: name, path: path, pol: pol, src: src, sum: sha256.Sum256(src)}, st, nil
}

// forget drops policy name when no pod uses it any more.
func (p *policies) forget(name string) {
	p.mu.Lock()
	delete(p.files, name)
	p.mu.Unlock()
}

// poll looks at every loaded policy's file and returns the new versions
// that parsed. Errors (a file gone, unreadable or that does not parse)
// keep the old version; each is reported once on report and counted.
func (p *policies) poll(report func(string)) []*version {
	p.mu.Lock()
	defer p.mu.Unlock()
	var changed []*version
	for name, f := range p.files {
		st, err := os.Stat(p.path(name))
		if err == nil && st.ModTime().Equal(f.modTime) && st.Size() == f.size {
			continue
		}
		var v *version
		if err == nil {
			v, st, err = p.read(name)
		}
		if err != nil {
			msg := err.Error()
			if errors.Is(err, os.ErrNotExist) {
				msg = fmt.Sprintf("policy %s: %s is gone", name, p.path(name))
			}
			if msg != f.lastErr {
				f.lastErr = msg
				p.errors[name]++
				report(fmt.Sprintf("tunwall node: %s; keeping the version in effect (sha256 %x)", msg, f.cur.sum[:6]))
			}
			continue
		}
		f.modTime, f.size, f.lastErr = st.ModTime(), st.Size(), ""
		if bytes.Equal(v.src, f.cur.src) {
			continue // touched, not changed
		}
		f.cur = v
		changed = append(changed, v)
	}
	return changed
}

// reloadErrors copies the counts of reload errors.
func (p *policies) reloadErrors() map[string]uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]uint64, len(p.errors))
	for k, v := range p.errors {
		out[k] = v
	}
	return out
}

// countError counts one reload error of policy name that is not the
// file's (a change the pods could not take).
func (p *policies) countError(name string) {
	p.mu.Lock()
	p.errors[name]++
	p.mu.Unlock()
}
