//! Fixture: a well-formed component exporting only `hello`; `add` must say it is no bundle.

wit_bindgen::generate!({
    inline: "
        package test:fixtures;
        world hello { export hello: func() -> string; }
    ",
});

struct Component;

impl Guest for Component {
    fn hello() -> String {
        "hello".into()
    }
}

export!(Component);
