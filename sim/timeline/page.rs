//! The drawing surface of the timeline: an SVG canvas whose time-positioned elements carry their
//! simulated instants (`data-a`, `data-b`, in µs) so the page's script can re-place them when the
//! reader zooms, the label packer, the time axis, and the HTML shell with its inline style and
//! script. Knows nothing about runs: [`super`] decides what to draw.
//!
//! Never loads anything from the network: the page is one self-contained file.

use std::fmt::Write as _;

use crate::records::Us;

/// SVG width in px (fits a 1600 px window with the page margins).
pub const WIDTH_PX: f64 = 1580.0;
/// Where the plot area starts (left of it: lane names).
pub const PLOT_LEFT_PX: f64 = 170.0;
/// Where the plot area ends.
pub const PLOT_RIGHT_PX: f64 = 1565.0;
/// Height of one header row (fault and violation labels).
pub const ROW_PX: f64 = 15.0;
/// Height of one lane.
pub const LANE_PX: f64 = 24.0;
/// Estimated width of one character of an 11 px label.
const CHAR_PX: f64 = 6.3;

/// Escapes text for HTML and SVG content and attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Seconds with one decimal, for labels and tooltips.
pub fn secs(at_us: Us) -> String {
    format!("{:.1}", at_us as f64 / 1e6)
}

/// An SVG under construction, scaled to a run of `end_us`.
pub struct Canvas {
    pub end_us: Us,
    pub body: String,
}

impl Canvas {
    pub fn new(end_us: Us) -> Self {
        Self { end_us: end_us.max(1), body: String::new() }
    }

    /// The x of an instant at full zoom.
    pub fn x(&self, at_us: Us) -> f64 {
        PLOT_LEFT_PX + (at_us.min(self.end_us) as f64 / self.end_us as f64) * (PLOT_RIGHT_PX - PLOT_LEFT_PX)
    }

    /// A rectangle over `[from_us, to_us]`, at least `min_px` wide at any zoom.
    #[allow(clippy::too_many_arguments)]
    pub fn band(
        &mut self,
        (from_us, to_us): (Us, Us),
        y: f64,
        h: f64,
        min_px: f64,
        class: &str,
        style: &str,
        title: &str,
    ) {
        let x = self.x(from_us);
        let w = (self.x(to_us) - x).max(min_px);
        let _ = write!(
            self.body,
            r#"<rect class="{class}" data-a="{from_us}" data-b="{to_us}" data-mw="{min_px}" x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" style="{style}">"#
        );
        self.close_with_title("rect", title);
    }

    /// A vertical line at `at_us` from `y1` to `y2`.
    pub fn mark(&mut self, at_us: Us, (y1, y2): (f64, f64), class: &str, style: &str, title: &str) {
        let x = self.x(at_us);
        let _ = write!(
            self.body,
            r#"<line class="{class}" data-a="{at_us}" x1="{x:.1}" x2="{x:.1}" y1="{y1:.1}" y2="{y2:.1}" style="{style}">"#
        );
        self.close_with_title("line", title);
    }

    /// A text label starting `dx_px` right of `at_us`, baseline at `y`.
    pub fn label(&mut self, at_us: Us, dx_px: f64, y: f64, class: &str, text: &str) {
        let x = self.x(at_us) + dx_px;
        let _ = write!(
            self.body,
            r#"<text class="{class}" data-a="{at_us}" data-dx="{dx_px}" x="{x:.1}" y="{y:.1}">{}</text>"#,
            esc(text)
        );
    }

    /// A fixed text in the lane-name column.
    pub fn name(&mut self, y: f64, class: &str, text: &str) {
        let _ = write!(self.body, r#"<text class="{class}" x="8" y="{y:.1}">{}</text>"#, esc(text));
    }

    /// Opens a group (e.g. one violation: its line, its label and its tooltip).
    pub fn open_group(&mut self, class: &str, attrs: &str, title: &str) {
        let _ = write!(self.body, r#"<g class="{class}" {attrs}><title>{}</title>"#, esc(title));
    }

    pub fn close_group(&mut self) {
        self.body.push_str("</g>");
    }

    /// A horizontal rule across the plot.
    pub fn rule(&mut self, y: f64, style: &str) {
        let _ = write!(self.body, r#"<line x1="0" x2="{PLOT_RIGHT_PX}" y1="{y:.1}" y2="{y:.1}" style="{style}"/>"#);
    }

    fn close_with_title(&mut self, tag: &str, title: &str) {
        if !title.is_empty() {
            let _ = write!(self.body, "<title>{}</title>", esc(title));
        }
        let _ = write!(self.body, "</{tag}>");
    }
}

/// Places labels in at most `rows` header rows without overlap (first fit, at full zoom).
pub struct Packer {
    row_ends_px: Vec<f64>,
    rows: usize,
}

impl Packer {
    pub fn new(rows: usize) -> Self {
        Self { row_ends_px: Vec::new(), rows }
    }

    /// The row of a label of `text` starting at `x_px`; `None` when every row is taken there.
    pub fn place(&mut self, x_px: f64, text: &str) -> Option<usize> {
        let end = x_px + text.chars().count() as f64 * CHAR_PX + 8.0;
        if let Some(row) = self.row_ends_px.iter().position(|&e| e <= x_px) {
            self.row_ends_px[row] = end;
            return Some(row);
        }
        if self.row_ends_px.len() < self.rows {
            self.row_ends_px.push(end);
            return Some(self.row_ends_px.len() - 1);
        }
        None
    }

    /// Rows used so far (at least one, so an empty header still has its title).
    pub fn used(&self) -> usize {
        self.row_ends_px.len().max(1)
    }
}

/// A tick step (µs) giving at most about twelve ticks over `span_us`. Mirrored in [`SCRIPT`].
pub fn tick_step_us(span_us: Us) -> Us {
    const STEPS_US: [Us; 12] = [
        100_000,
        200_000,
        500_000,
        1_000_000,
        2_000_000,
        5_000_000,
        10_000_000,
        20_000_000,
        30_000_000,
        60_000_000,
        120_000_000,
        300_000_000,
    ];
    STEPS_US.iter().copied().find(|s| span_us / s <= 12).unwrap_or(600_000_000)
}

/// The time axis at full zoom (the script redraws it on zoom): tick labels at `y`, grid lines
/// down to `bottom`.
pub fn axis(canvas: &Canvas, y: f64, bottom: f64) -> String {
    let step = tick_step_us(canvas.end_us);
    let mut out = String::new();
    let mut at = 0;
    while at <= canvas.end_us {
        let x = canvas.x(at);
        let _ = write!(
            out,
            r#"<line class="grid" x1="{x:.1}" x2="{x:.1}" y1="{:.1}" y2="{bottom:.1}"/><text class="tick" x="{x:.1}" y="{y:.1}">{}s</text>"#,
            y + 4.0,
            at as f64 / 1e6
        );
        at += step;
    }
    out
}

/// The page: a header, the legend, the zoom controls, the SVG and the findings list.
pub struct Page<'a> {
    pub title: &'a str,
    pub header_html: &'a str,
    pub legend_html: &'a str,
    /// Lane names and rules: not zoomed, not clipped.
    pub fixed_svg: &'a str,
    /// Everything placed in time: zoomed and clipped to the plot.
    pub svg_body: &'a str,
    pub axis: &'a str,
    pub axis_y: f64,
    pub height_px: f64,
    pub end_us: Us,
    pub findings_html: &'a str,
}

impl Page<'_> {
    pub fn render(&self) -> String {
        let Page {
            title,
            header_html,
            legend_html,
            fixed_svg,
            svg_body,
            axis,
            axis_y,
            height_px,
            end_us,
            findings_html,
        } = self;
        let end_s = *end_us as f64 / 1e6;
        format!(
            r##"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>{STYLE}</style></head>
<body>
{header_html}
<div class="controls">zoom: <input id="from" type="number" step="0.1" min="0" value="0"> s to
<input id="to" type="number" step="0.1" min="0" value="{end_s}"> s <button id="apply">zoom</button>
<button id="reset">whole run</button> <span class="hint">or drag across the chart; double-click resets; a link may end in <code>#15-35</code> (seconds)</span></div>
{legend_html}
<svg id="tl" xmlns="http://www.w3.org/2000/svg" width="{WIDTH_PX}" height="{height_px:.0}" viewBox="0 0 {WIDTH_PX} {height_px:.0}" data-end="{end_us}" data-left="{PLOT_LEFT_PX}" data-right="{PLOT_RIGHT_PX}" data-axis-y="{axis_y:.1}">
<defs><clipPath id="plot"><rect x="{PLOT_LEFT_PX}" y="0" width="{plot_w:.1}" height="{height_px:.0}"/></clipPath>
<pattern id="drain" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#f6c453"/><rect width="2.5" height="6" fill="#8a5a00"/></pattern></defs>
<g id="axis">{axis}</g>
{fixed_svg}
<g clip-path="url(#plot)">{svg_body}</g>
<rect id="sel" x="0" y="0" width="0" height="{height_px:.0}" style="fill:#3b82f6;fill-opacity:0.15;display:none"/>
</svg>
{findings_html}
<script>{SCRIPT}</script>
</body></html>
"##,
            title = esc(title),
            plot_w = PLOT_RIGHT_PX - PLOT_LEFT_PX,
        )
    }
}

const STYLE: &str = r#"
body{font:13px system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:8px;color:#222;background:#fff}
h1{font-size:17px;margin:2px 0 4px}
.meta{color:#555;margin:2px 0}
.meta code,.findings code{background:#f3f3f3;padding:0 3px}
.controls{margin:6px 0}.controls input{width:70px}.hint{color:#888}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;margin:4px 0 6px;color:#444}
.legend span{white-space:nowrap}.sw{display:inline-block;width:14px;height:10px;margin-right:4px;vertical-align:middle;border-radius:2px}
svg text{font-size:11px;fill:#333}
svg .lane-name{font-size:12px;fill:#222}svg .section{font-size:11px;fill:#888;font-weight:600;letter-spacing:.04em}
svg .tick{fill:#666;text-anchor:middle}svg .grid{stroke:#e6e6e6}
svg .fault-label{fill:#5b3b00}svg .action-label{fill:#555;font-style:italic}
svg .violation text{fill:#c00;font-weight:600}
svg rect,svg line{shape-rendering:crispEdges}
svg .ans-ok{stroke:#2a9d4f}svg .ans-pending{stroke:#e0a800;stroke-width:2}svg .ans-fenced{stroke:#6b21a8;stroke-width:2}
svg .ans-error{stroke:#999}svg .ans-hidden{stroke:#ccc}
.findings{margin:8px 0 0 0;padding-left:24px;max-width:1560px}
.findings li{margin:2px 0;color:#222;cursor:pointer}.findings li b{color:#c00}
"#;

/// Zoom: re-place every element that carries `data-a` (and `data-b`) for the range shown, and
/// redraw the axis. The tick step choice mirrors `tick_step_us`.
const SCRIPT: &str = r#"
(function(){
const svg=document.getElementById('tl'),END=+svg.dataset.end,L=+svg.dataset.left,R=+svg.dataset.right,AY=+svg.dataset.axisY;
const H=+svg.getAttribute('height');let t0=0,t1=END;
const from=document.getElementById('from'),to=document.getElementById('to');
const X=t=>L+(t-t0)/(t1-t0)*(R-L);
const STEPS=[1e5,2e5,5e5,1e6,2e6,5e6,1e7,2e7,3e7,6e7,1.2e8,3e8];
function axis(){const g=document.getElementById('axis');const span=t1-t0;const step=STEPS.find(s=>Math.floor(span/s)<=12)||6e8;
 let h='';for(let t=Math.ceil(t0/step)*step;t<=t1;t+=step){const x=X(t).toFixed(1);
 h+=`<line class="grid" x1="${x}" x2="${x}" y1="${AY+4}" y2="${H}"/><text class="tick" x="${x}" y="${AY}">${+(t/1e6).toFixed(1)}s</text>`;}
 g.innerHTML=h;}
function draw(){for(const e of svg.querySelectorAll('[data-a]')){const a=+e.dataset.a;
 if(e.tagName==='rect'){const x=X(a);e.setAttribute('x',x);e.setAttribute('width',Math.max(X(+e.dataset.b)-x,+e.dataset.mw||0));}
 else if(e.tagName==='line'){const x=X(a);e.setAttribute('x1',x);e.setAttribute('x2',x);}
 else if(e.tagName==='text'){e.setAttribute('x',X(a)+(+e.dataset.dx||0));}
 else if(e.tagName==='circle'){e.setAttribute('cx',X(a));}}
 from.value=(t0/1e6).toFixed(1);to.value=(t1/1e6).toFixed(1);axis();}
function zoom(a,b){a=Math.max(0,Math.min(a,END));b=Math.max(0,Math.min(b,END));if(b-a<1e4)return;t0=a;t1=b;draw();}
document.getElementById('apply').onclick=()=>zoom(+from.value*1e6,+to.value*1e6);
document.getElementById('reset').onclick=()=>zoom(0,END);
svg.addEventListener('dblclick',()=>zoom(0,END));
const sel=document.getElementById('sel');let d=null;
const px=ev=>{const r=svg.getBoundingClientRect();return (ev.clientX-r.left)*(svg.viewBox.baseVal.width/r.width);};
const T=x=>t0+(x-L)/(R-L)*(t1-t0);
svg.addEventListener('mousedown',ev=>{const x=px(ev);if(x<L)return;d=x;sel.setAttribute('x',x);sel.setAttribute('width',0);sel.style.display='';ev.preventDefault();});
svg.addEventListener('mousemove',ev=>{if(d===null)return;const x=px(ev);sel.setAttribute('x',Math.min(d,x));sel.setAttribute('width',Math.abs(x-d));});
window.addEventListener('mouseup',ev=>{if(d===null)return;const x=px(ev);sel.style.display='none';const a=T(Math.min(d,x)),b=T(Math.max(d,x)),moved=Math.abs(x-d)>4;d=null;if(moved)zoom(a,b);});
for(const li of document.querySelectorAll('.findings li[data-at]')){li.onclick=()=>{const at=+li.dataset.at;zoom(at-5e6,at+5e6);};}
const m=/^#(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)$/.exec(location.hash);if(m){zoom(+m[1]*1e6,+m[2]*1e6);}else{draw();}
})();
"#;
