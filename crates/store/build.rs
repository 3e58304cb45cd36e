// Rebuild when a migration is added or changed: `sqlx::migrate!` embeds the directory's contents.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
