// Package dashboard is the controller's read-only web dashboard and the
// data behind `mosto status`: a world map of the FEPs with their links
// coloured by RTT, the RTT matrix as a heat map with the change history of
// every pair, each LoP's table (chains per size class, predicted cost, the
// model's inputs), per FEP the counters its proxy pushes with its reports
// (flows/s, bytes/s, active flows, refusals and direct fallbacks by reason,
// pool results), and the controller's leader, table versions and key age.
//
// A Dashboard polls its Source (the controller, in process) every Poll and
// at every report, keeps a State, the rates between two counter pushes and
// the recent RTT changes, and pushes each new State to the browsers with
// Server-Sent Events (GET /ui/events); GET /ui/state is the same JSON once
// (`mosto status` reads it), GET /ui/table/{lop} one LoP's table. The page
// (index.html, app.js, style.css) is embedded with go:embed, plain SVG and
// JavaScript, no script from elsewhere.
//
// The package only reads: it has no handler that changes anything. It owns
// no listener; internal/cli serves Handler on the controller's admin
// listener (--ui-listen) behind basic authentication.
package dashboard
