//! Fixture: imports `test:fixtures/spy`, which no host provides; `add` must name it.

wit_bindgen::generate!({
    inline: "
        package test:fixtures;
        interface spy { peek: func() -> string; }
        world bad-import { import spy; export run: func() -> string; }
    ",
});

struct Component;

impl Guest for Component {
    fn run() -> String {
        test::fixtures::spy::peek()
    }
}

export!(Component);
