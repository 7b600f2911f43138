package proxy

import (
	"context"
	"sort"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/txstate"
	"github.com/poolerd/poolerd/internal/wire"
)

// The hand-off check (verify_handoff): before a transaction- or
// statement-mode server connection passes from one client to another,
// poolerd asks it, in one query with one row (txstate.HandoffSQL), what session
// state it holds, and compares the answer with what poolerd believes is
// there (txstate.CheckHandoff). A connection that holds anything poolerd did not
// expect is closed instead of handed out: a WARN names what was found and
// the client that left it, and poolerd_handoff_dirty_total{kind} counts it.
//
// Where: at the release point (serverConn.settleLocked). The connection is
// clean and its owner gives it back; with the check due, poolerd sends the
// fingerprint query and the owner gives the connection up, but it does
// not join the idle list: nobody holds it (checking) until the answer is
// in, when it is checked in if clean (checkedLocked) or closed. So a dirty
// connection is never in the idle list, where anyone could take it, and the
// client does not wait: its answer went out already, and its next request
// checks out a connection as it would have anyway (a client that kept the
// connection through the check would keep it for as long as it sends its
// next request within a round trip, which starves the other clients of a
// busy pool). Only the connection is held one round trip longer. The other
// hand-off, a client leaving (session.releaseAtEnd), runs the check
// synchronously after the reset query, before the connection goes back.

// evictHandoffDirty is the eviction reason of a connection the check closed.
const evictHandoffDirty = "handoff_dirty"

// maxHandoffRow bounds the captured answer of a check (its settings column
// grows with the settings a client left).
const maxHandoffRow = 64 << 10

// handoffClient is who left a connection, for the WARN: no secret.
type handoffClient struct {
	id                  uint64
	user, database, app string
	addr                string
	present             bool
}

// handoffClient describes s for a check of the connection it gives up.
func (s *session) handoffClient() handoffClient {
	s.pmu.Lock()
	app := s.params["application_name"]
	s.pmu.Unlock()
	return handoffClient{id: s.id, user: s.user, database: s.database, app: app, addr: s.addr, present: true}
}

// handoffDueLocked reports whether the connection, clean and about to be
// given back, must be checked first (sc.mu held): not when the last thing
// sent on it was a check that came back clean; else as verify_handoff says,
// sample counting the pool's hand-offs.
func (sc *serverConn) handoffDueLocked() bool {
	if sc.verifiedZ >= 0 && sc.verifiedZ == sc.zSent-1 {
		return false
	}
	switch every := sc.dbp.srv.cfg().HandoffEvery(); every {
	case 0:
		return false
	case 1:
		return true
	default:
		return sc.dbp.handoffs.Add(1)%every == 0
	}
}

// handoffCustomLocked lists the customized options (a.b) the check asks
// for: those applied on the connection and those own touched.
func (sc *serverConn) handoffCustomLocked(own *session) []string {
	var out []string
	if own != nil {
		out = own.customOptions()
	}
	for name := range sc.applied {
		if strings.Contains(name, ".") {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// prepareHandoffLocked records who leaves the connection and returns the
// check's query (sc.mu held).
func (sc *serverConn) prepareHandoffLocked(own *session) string {
	sc.verifyBy = handoffClient{}
	sc.verifyTracked = false
	if own != nil {
		sc.verifyBy = own.handoffClient()
		sc.verifyTracked = own.tracked
	}
	sc.verifyRow = sc.verifyRow[:0]
	sc.verifyGot = false
	return txstate.HandoffSQL(sc.handoffCustomLocked(own))
}

// verifyLocked sends the check for own on a clean connection, which own
// then gives up (settleLocked); the answer comes to handoffAnsweredLocked,
// then checkedLocked.
func (sc *serverConn) verifyLocked(own *session) {
	sc.checking = true
	z := sc.zSent
	sc.ownQueryLocked(&sc.verifyZ, sc.prepareHandoffLocked(own))
	// Nobody's watchdog covers a connection in a check: a server that
	// does not answer within server_response_timeout (resetTimeout
	// without one) has its connection closed.
	d := time.Duration(own.timeouts().serverResponseTimeout)
	if d <= 0 {
		d = resetTimeout
	}
	time.AfterFunc(d, func() { sc.checkOverdue(z, d) })
}

// checkOverdue closes the connection if the check sent as group z is
// still unanswered.
func (sc *serverConn) checkOverdue(z int64, d time.Duration) {
	sc.mu.Lock()
	stuck := sc.checking && sc.verifyZ.Load() == z && !sc.broken
	sc.mu.Unlock()
	if stuck {
		sc.log.Warn("hand-off check not answered; closing the server connection",
			zap.Uint64("conn_id", sc.ID()), zap.Duration("after", d))
		_ = sc.Close()
	}
}

// checkedLocked ends a check that nobody waited for (sc.mu held; it
// unlocks it): a clean connection joins the idle list, a dirty one is
// closed.
func (sc *serverConn) checkedLocked() {
	sc.checking = false
	clean := sc.cleanLocked() && sc.verifiedZ == sc.zSent-1
	sc.mu.Unlock()
	if clean {
		sc.dbp.checkin(sc)
		return
	}
	sc.dbp.pool.Discard(sc, evictHandoffDirty)
}

// handoffRow keeps the check's DataRow. Reader goroutine.
func (sc *serverConn) handoffRow(body []byte, truncated bool) {
	sc.verifyRow = append(sc.verifyRow[:0], body...)
	sc.verifyGot = !truncated
}

// handoffAnsweredLocked takes the end of a check's answer (sc.mu held,
// reader goroutine): clean, the connection may be released (verifiedZ);
// dirty or failed, it is marked broken, to be closed at its idle point,
// and the WARN and the metric say so.
func (sc *serverConn) handoffAnsweredLocked() {
	var found []txstate.HandoffFinding
	cols, ok := txstate.ParseHandoffRow(sc.verifyRow)
	switch {
	case !sc.verifyGot || !ok:
		what := "no complete answer"
		if sc.opErr != nil {
			what = sc.opErr.Error()
			sc.opErr = nil // the check's own error
		}
		found = []txstate.HandoffFinding{{Kind: txstate.HandoffCheckFailed, What: what}}
	default:
		role := sc.applied["role"]
		found = txstate.CheckHandoff(cols, txstate.HandoffExpect{
			Login: sc.loginAuth, Role: role, RoleReset: sc.roleBy != 0, Tracked: sc.verifyTracked,
			Params: sc.params, Applied: sc.applied, Norm: sc.normApplied,
		})
	}
	sc.verifyRow = sc.verifyRow[:0]
	sc.verifyGot = false
	if len(found) == 0 {
		sc.verifiedZ = sc.zRecv
		return
	}
	sc.broken = true
	sc.reportHandoff(found)
}

// reportHandoff logs and counts a dirty or failed check.
func (sc *serverConn) reportHandoff(found []txstate.HandoffFinding) {
	kinds := make([]string, 0, len(found))
	whats := make([]string, 0, len(found))
	for _, f := range found {
		kinds = append(kinds, f.Kind)
		whats = append(whats, f.Kind+": "+f.What)
		sc.dbp.srv.countHandoffDirty(f.Kind)
	}
	fields := []zap.Field{zap.Uint64("conn_id", sc.ID()), zap.Strings("kinds", kinds),
		zap.String("found", strings.Join(whats, "; "))}
	if c := sc.verifyBy; c.present {
		fields = append(fields, zap.Uint64("left_by_session", c.id), zap.String("left_by_user", c.user),
			zap.String("left_by_database", c.database), zap.String("left_by_application_name", c.app),
			zap.String("left_by_client", c.addr))
	}
	sc.log.Warn(handoffDirtyMsg, fields...)
}

// handoffDirtyMsg is the WARN of a dirty hand-off (the integration harness
// fails a test whose poolerd logs it).
const handoffDirtyMsg = "hand-off check: server connection holds session state poolerd did not expect; closing it"

// countHandoffDirty counts one finding of kind.
func (srv *Server) countHandoffDirty(kind string) {
	if m := srv.metrics; m != nil {
		m.handoffDirty[txstate.HandoffKindIndex(kind)].Inc()
	}
}

// verifyHandoff runs the check synchronously on a connection nobody holds,
// that own (nil if none) gave up; it reports whether the connection is
// clean.
func (sc *serverConn) verifyHandoff(ctx context.Context, own *session) bool {
	sc.mu.Lock()
	sql := sc.prepareHandoffLocked(own)
	sc.mu.Unlock()
	err := sc.execOwn(ctx, &sc.verifyZ, sql)
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if err != nil {
		// Not answered (the connection failed, or a timeout): it is
		// closed, as after any failed query of poolerd's own; no WARN, as
		// nothing was found on it.
		sc.broken = true
		sc.log.Debug("hand-off check not answered; closing the connection",
			zap.Uint64("conn_id", sc.ID()), zap.Error(err))
	}
	return !sc.broken
}

// awaitOwnLocked is called (sc.mu held) when s, leaving, still holds sc:
// if all that is in flight on it are poolerd's own queries sent at the end
// of s's last transaction (a settings snapshot, a DEALLOCATE ALL after a
// schema change, a pin check), it waits for their answers (up to
// resetTimeout in all) instead of having them cancelled and the connection
// closed, as a request of the client's would be. Their answers may release
// sc or hand it to a hand-off check (settleLocked). It reports whether s
// still holds sc, with sc.mu held again.
func (sc *serverConn) awaitOwnLocked(s *session) bool {
	t := time.NewTimer(resetTimeout)
	defer t.Stop()
	// Each answer may send the next (a snapshot's, the check).
	for sc.owner.Load() == s && sc.ownOnlyLocked() {
		quiet := make(chan struct{})
		sc.quiet = quiet
		sc.mu.Unlock()
		expired := false
		select {
		case <-quiet:
		case <-t.C:
			expired = true
		case <-s.srv.ctx.Done():
			expired = true
		}
		sc.mu.Lock()
		if sc.quiet == quiet {
			sc.quiet = nil
		}
		if expired {
			break
		}
	}
	return sc.owner.Load() == s
}

// ownOnlyLocked reports whether all that is in flight on the connection
// are poolerd's own queries, sent at idle.
func (sc *serverConn) ownOnlyLocked() bool {
	return sc.pending > 0 && sc.pending == len(sc.swallowQ) && !sc.unsynced && sc.txStatus == wire.TxIdle &&
		sc.stq.len() == 0 && len(sc.qundo) == 0 && !sc.cancelling && !sc.midFrame && !sc.clientMid && !sc.broken && sc.quiet == nil
}
