package attach

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/taproce/taproce/appliance/admin"
	"github.com/taproce/taproce/appliance/redirect"
)

// stateVersion is the version of the state file's format.
const stateVersion = 1

// state is the state file's contents: the requests that made the
// manager's attachments, which hold everything needed to make them again.
type state struct {
	Version     int                   `json:"version"`
	Attachments []admin.AttachRequest `json:"attachments"`
}

// saveLocked writes m.records to the state file, if there is one: to a
// temporary file in the same directory, synced, then renamed over the
// old one, so that a crash leaves the old list or the new one. m.op is
// held.
func (m *Manager) saveLocked() error {
	path := m.opts.StateFile
	if path == "" {
		return nil
	}
	st := state{Version: stateVersion, Attachments: make([]admin.AttachRequest, 0, len(m.records))}
	for _, id := range slices.Sorted(maps.Keys(m.records)) {
		st.Attachments = append(st.Attachments, m.records[id])
	}
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("state file %s: %w", path, err)
	}
	data = append(data, '\n')
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("state file %s: %w", path, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("state file %s: %w", path, err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(0o600)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("state file %s: %w", path, err)
	}
	return nil
}

// loadState reads the state file at path; a missing file is an empty
// list.
func loadState(path string) ([]admin.AttachRequest, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("state file: %w", err)
	}
	var st state
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("state file %s: %w", path, err)
	}
	if st.Version != stateVersion {
		return nil, fmt.Errorf("state file %s: version %d, want %d", path, st.Version, stateVersion)
	}
	return st.Attachments, nil
}

// Recovery is what Recover did with the attachments an earlier run left.
type Recovery struct {
	// Adopted are the IDs of attachments made again: the pod's namespace
	// and interface were there, and the port is back with its redirect.
	Adopted []string
	// Cleaned are the IDs of attachments whose pod is gone (or that could
	// not be made again, see Failed): their filters, if any were left,
	// are removed, and they are no longer recorded.
	Cleaned []string
	// Failed maps the IDs of cleaned attachments that existed but could
	// not be made again to the reason.
	Failed map[string]string
}

// Recover takes over what an earlier run of the appliance left behind,
// as its state file lists it. That run's TAP devices went with its
// process, but its tc filters stay on the pods' interfaces and redirect
// the pods' RoCEv2 traffic to nothing. For each recorded attachment
// whose namespace and pod interface still exist, Recover attaches again
// as the original request asked: a new port with the pod's current MAC,
// the same addresses, and the filters pointed at the new TAP; the pod
// keeps RoCE without a new CNI ADD. Attachments whose pod is gone, and
// those that cannot be made again, are cleaned: their filters removed,
// their records dropped. The state file is rewritten to list what is
// attached.
//
// Without a state file Recover does nothing. Call it once, before serving
// the admin API; an attachment already known to the manager is left as it
// is. It returns an error only when the state file cannot be read or
// written; problems of single attachments are in the Recovery.
func (m *Manager) Recover(ctx context.Context) (Recovery, error) {
	var rec Recovery
	if m.opts.StateFile == "" {
		return rec, nil
	}
	reqs, err := loadState(m.opts.StateFile)
	if err != nil {
		return rec, err
	}
	m.op.Lock()
	defer m.op.Unlock()
	// Every record joins m.records first, so that the file keeps listing
	// the ones not handled yet whenever it is written on the way.
	var todo []admin.AttachRequest
	for _, req := range reqs {
		if err := req.Normalize(); err != nil {
			m.log.Warn("state file: invalid attachment dropped", "id", req.ID(), "err", err)
			continue
		}
		if _, dup := m.records[req.ID()]; dup || m.get(req.ID()) != nil {
			continue
		}
		m.records[req.ID()] = req
		todo = append(todo, req)
	}
	slices.SortFunc(todo, func(a, b admin.AttachRequest) int { return cmp.Compare(a.ID(), b.ID()) })
	for _, req := range todo {
		if err := ctx.Err(); err != nil {
			return rec, err
		}
		id := req.ID()
		_, err := m.attachLocked(req)
		if err == nil {
			rec.Adopted = append(rec.Adopted, id)
			m.log.Info("attachment adopted", "id", id, "netns", req.Netns, "port", req.PortName)
			continue
		}
		// Gone, or not to be made again: remove what is left and forget it.
		delete(m.records, id)
		rec.Cleaned = append(rec.Cleaned, id)
		if !errors.Is(err, admin.ErrNetnsGone) {
			if rec.Failed == nil {
				rec.Failed = map[string]string{}
			}
			rec.Failed[id] = err.Error()
		}
		attrs := []any{"id", id, "netns", req.Netns, "reason", err}
		if rmErr := redirect.Remove(redirect.Config{Netns: req.Netns, Pod: req.IfName, TAP: req.PortName}); rmErr != nil {
			attrs = append(attrs, "remove_err", rmErr)
		}
		m.log.Info("attachment cleaned", attrs...)
	}
	return rec, m.saveLocked()
}
